"""Test helpers that check snapver's results without using snapver's code.

Everything here is deliberately independent of the package under test: trees are
hashed with hashlib, the store is read with the git command line, configs are
written by a small TOML serializer of our own.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "Result",
    "Sshd",
    "git_blob",
    "git_ls_tree",
    "local_node",
    "toml_dumps",
    "tree_hashes",
]


@dataclass(frozen=True)
class Sshd:
    """A running OpenSSH server on loopback, shared by the whole test session.

    Attributes:
        port: the TCP port, the same on every listen address.
        identity_file: private ed25519 user key accepted for root.
        known_hosts: known_hosts file listing every listen address with the host key.
        host_public_key: the host key as ``ssh-ed25519 AAAA...`` (no comment).
        addresses: node name → loopback address (``ct200``, ``ct129``, ``fleet00``..``fleet15``).
        dir: the server's private folder (config, keys, pid file, ``sshd.log``).
    """

    port: int
    identity_file: Path
    known_hosts: Path
    host_public_key: str
    addresses: dict[str, str]
    dir: Path

    @property
    def log(self) -> Path:
        """sshd's stderr (``-e``), useful in failure messages."""
        return self.dir / "sshd.log"


@dataclass(frozen=True)
class Result:
    """What a ``snapver`` subprocess did: exit code, stdout, stderr (text)."""

    code: int
    out: str
    err: str

    def __str__(self) -> str:
        return f"exit {self.code}\n--- stdout ---\n{self.out}--- stderr ---\n{self.err}"


def local_node(site_packages: os.PathLike[str] | str, **extra: Any) -> dict[str, Any]:
    """Return a ``[nodes.X]`` table for a local (no SSH) node."""
    return {"local": True, "site_packages": str(site_packages), **extra}


# --------------------------------------------------------------------------- trees


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _is_pycache(name: str, is_dir: bool) -> bool:
    return name == "__pycache__" if is_dir else name.endswith(".pyc")


def tree_hashes(
    root: os.PathLike[str] | str,
    paths: Iterable[str] = ("sglang/srt",),
    exclude_pycache: bool = True,
) -> dict[str, tuple[str, int, str]]:
    """Hash the tracked trees under ``root`` the way a careful human would.

    Symlinks are never followed: a link (to a file or to a folder) is one entry
    whose digest is the sha256 of its target bytes. Folders themselves are not
    entries. Sockets, FIFOs and devices are ignored. A missing path yields nothing.

    Args:
        root: a site-packages folder.
        paths: tracked paths relative to ``root``.
        exclude_pycache: leave out ``__pycache__/`` folders and ``*.pyc`` files
            (snapver's default ``exclude``).

    Returns:
        ``{relative path: (kind, mode, sha256 hex)}`` with kind ``"f"`` (mode is
        ``st_mode & 0o7777``) or ``"l"`` (mode 0). Paths use ``/`` and
        ``os.fsdecode``, so undecodable bytes survive as surrogate escapes.
    """
    root_bytes = os.fsencode(root)
    hashes: dict[str, tuple[str, int, str]] = {}

    def visit(rel: bytes) -> None:
        full = os.path.join(root_bytes, rel)
        try:
            info = os.lstat(full)
        except FileNotFoundError:
            return
        name = os.fsdecode(os.path.basename(rel))
        if stat.S_ISLNK(info.st_mode):
            target = os.readlink(full)
            hashes[os.fsdecode(rel)] = ("l", 0, hashlib.sha256(target).hexdigest())
        elif stat.S_ISREG(info.st_mode):
            if exclude_pycache and _is_pycache(name, is_dir=False):
                return
            hashes[os.fsdecode(rel)] = (
                "f",
                stat.S_IMODE(info.st_mode),
                _sha256_file(Path(os.fsdecode(full))),
            )
        elif stat.S_ISDIR(info.st_mode):
            if exclude_pycache and _is_pycache(name, is_dir=True):
                return
            for child in sorted(os.listdir(full)):
                visit(os.path.join(rel, child))

    for tracked in paths:
        visit(os.fsencode(tracked.strip("/")))
    return dict(sorted(hashes.items()))


# --------------------------------------------------------------------------- git


def _git(store: os.PathLike[str] | str, *args: str) -> bytes:
    completed = subprocess.run(
        ["git", "-C", os.fspath(store), *args],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        check=False,
    )
    if completed.returncode != 0:
        raise AssertionError(
            f"git {' '.join(args)} failed ({completed.returncode}): "
            f"{completed.stderr.decode(errors='replace').strip()}"
        )
    return completed.stdout


def git_ls_tree(store: os.PathLike[str] | str, rev: str) -> dict[str, tuple[str, str]]:
    """List every blob/link/submodule of ``rev`` in ``store``: ``{path: (mode, oid)}``.

    Uses ``git ls-tree -r -z --full-tree``, so paths are raw (no quoting) and
    relative to the tree's root; modes are git's (``100644``, ``100755``, ``120000``).
    """
    raw = _git(store, "ls-tree", "-r", "-z", "--full-tree", rev)
    listing: dict[str, tuple[str, str]] = {}
    for record in raw.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        mode, _kind, oid = meta.decode("ascii").split(" ")
        listing[os.fsdecode(path)] = (mode, oid)
    return listing


def git_blob(store: os.PathLike[str] | str, oid: str) -> bytes:
    """Return the content of blob ``oid`` in ``store`` (``git cat-file blob``)."""
    return _git(store, "cat-file", "blob", oid)


# --------------------------------------------------------------------------- TOML

_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_string(text: str) -> str:
    out = []
    for char in text:
        if char in _ESCAPES:
            out.append(_ESCAPES[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04X}")
        elif 0xD800 <= ord(char) <= 0xDFFF:
            raise ValueError(f"TOML cannot hold the lone surrogate in {text!r}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if _BARE_KEY.fullmatch(key) else _toml_string(key)


def _toml_value(value: Any) -> str:
    # bool before int: bool is an int subclass.
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, (str, os.PathLike)):
        return _toml_string(os.fspath(value))
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        items = ", ".join(f"{_toml_key(k)} = {_toml_value(v)}" for k, v in value.items())
        return "{" + items + "}" if items else "{}"
    raise TypeError(f"cannot write {type(value).__name__} to TOML: {value!r}")


def _toml_table(header: str, table: Mapping[str, Any]) -> str:
    lines = [f"[{header}]"]
    lines += [f"{_toml_key(key)} = {_toml_value(value)}" for key, value in table.items()]
    return "\n".join(lines) + "\n"


def toml_dumps(document: Mapping[str, Mapping[str, Any]]) -> str:
    """Write a two-level TOML document: ``{table: {key: value}}``.

    A table whose values are all mappings (like ``nodes``) becomes one
    ``[table.name]`` section per entry; any other table is one ``[table]``
    section. Values: str (and paths), int, float, bool, lists, inline tables.
    """
    sections = []
    for name, table in document.items():
        if table and all(isinstance(v, Mapping) for v in table.values()):
            sections += [
                _toml_table(f"{_toml_key(name)}.{_toml_key(sub)}", subtable)
                for sub, subtable in table.items()
            ]
        else:
            sections.append(_toml_table(_toml_key(name), table))
    return "\n".join(sections)


def linked_copy(source: Path, target: Path) -> None:
    """A copy of a tree made of hard links (fast); ``rewrite`` changes one file of it."""
    shutil.copytree(source, target, symlinks=True, copy_function=os.link)


def rewrite(path: Path, text: str) -> None:
    """Replace a file's content without touching the other names of its inode."""
    if path.exists():
        path.unlink()
    path.write_text(text)


@contextmanager
def tmpfs(mount_point: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` (``8m``) mounted at ``mount_point`` (the suite runs as root),
    unmounted afterwards whatever happened: a disk that fills up for real."""
    import pytest

    mount_point.mkdir(exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs (the suite runs as root): {done.stderr}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)
