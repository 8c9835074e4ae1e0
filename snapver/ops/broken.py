"""Files a patch would deploy broken: unresolved conflict markers, Python that does not compile.

Push refuses them (``--allow-broken`` overrides, and the push record says so), compiling
each ``.py`` file with the node's own interpreter (``Transport.compile_sources``); `patch
save`, `import` and `rebase` warn about the same files at once, compiling here.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from snapver.model import FILE, Entry
from snapver.store.repo import BIG_BLOB, Store

# Conflict-marker lines as `git merge-file` / `git merge` write them (diff3 style too).
_OPENERS = (b"<<<<<<<", b">>>>>>>", b"|||||||")


@dataclass(frozen=True)
class BrokenFile:
    """One file that must not land as it is: where, and why."""

    path: str
    line: int | None
    problem: str
    node: str | None = None  # the node whose Python refused it (None: broken anywhere)

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.problem}" + (f" (on {self.node}'s Python)" if self.node else "")

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "problem": self.problem, "node": self.node}


def _is_marker(line: bytes) -> bool:
    line = line.rstrip(b"\r")
    return line == b"=======" or any(line == m or line.startswith(m + b" ") for m in _OPENERS)


def conflict_markers(path: str, data: bytes, base: bytes | None = None) -> BrokenFile | None:
    """The first unresolved conflict marker in ``data`` that ``base`` does not have, or None.

    A lone ``=======`` (a reStructuredText underline) counts only beside a ``<<<<<<<`` or
    ``>>>>>>>`` line the base lacks; binary content (a NUL) is never text with markers.
    """
    if b"\0" in data[:8192] or b"=======" not in data and b"<<<<<<<" not in data and b">>>>>>>" not in data:
        return None
    known = set(base.split(b"\n")) if base else set()
    found = [(number, line) for number, line in enumerate(data.split(b"\n"), 1)
             if _is_marker(line) and line not in known]
    if not any(not line.rstrip(b"\r").startswith(b"=") for _, line in found):
        return None
    number, line = found[0]
    shown = line.rstrip(b"\r").decode("utf-8", "replace")
    return BrokenFile(path, number, f"unresolved conflict marker {shown!r}")


def big_binary(store: Store, entry: Entry) -> bool:
    """A file too big to read whole (``BIG_BLOB``) whose first 8000 bytes hold a NUL: binary,
    so it has no conflict markers and is no Python source. Judged from its first bytes only."""
    return entry.kind == FILE and entry.size > BIG_BLOB and b"\0" in store.blob_head(entry.oid)


def syntax_error(path: str, data: bytes) -> BrokenFile | None:
    """This Python's verdict on a ``.py`` file (None: it compiles, or is not Python)."""
    if not path.endswith(".py"):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(data, path, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return BrokenFile(path, exc.lineno, f"{type(exc).__name__}: {exc.msg}")
    except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
        return BrokenFile(path, None, f"{type(exc).__name__}: {exc}")
    return None


def broken_files(files: Iterable[Any], read_blob: Callable[[str], bytes],
                 compile_here: bool = True, store: Store | None = None) -> list[BrokenFile]:
    """The files of a patch (``PatchFile``s) that hold new conflict markers, or (``compile_here``)
    Python this interpreter cannot compile; sorted by path. With ``store``, a big binary file
    is judged from its first bytes (``big_binary``), never read whole."""
    found: list[BrokenFile] = []
    for item in files:
        if item.patch is None or item.patch.kind != FILE or store is not None and big_binary(store, item.patch):
            continue
        data = read_blob(item.patch.oid)
        base = read_blob(item.base.oid) if item.base is not None and item.base.kind == FILE else None
        problem = conflict_markers(item.path, data, base) or (syntax_error(item.path, data) if compile_here else None)
        if problem is not None:
            found.append(problem)
    return sorted(found, key=lambda b: b.path)
