"""A local folder as a tree: which root it is (a site-packages, srt/, a source checkout, the
inside of a tracked folder), matched to the tracked paths (SPEC "Refs": ``./dir``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from snapver.config import DEFAULT_EXCLUDE, DEFAULT_PATHS, Config, NodeSpec
from snapver.errors import RefError, StoreError
from snapver.store import refs as store_refs
from snapver.store.repo import Store

# A folder is matched to a tracked path (say ``sglang/srt``) by what it holds, tried in
# this order: a site-packages (``sglang/srt/``), a source checkout (``python/sglang/srt/``),
# a stand-in for a folder above the tracked one (``srt/``), or the tracked folder itself
# (its inside: ``speculative/``, ``layers/`` ...). ``--root PREFIX`` says which instead.

FOLDER_HINT = "a folder ref is an existing directory: ./dir, /abs/dir or ~/dir"


@dataclass(frozen=True)
class FolderTree:
    """A local folder read as a live tree, and which tracked paths it stands for.

    The local agent reads it as the site-packages ``site``: each ``(disk, tracked)`` of
    ``roots`` is a folder below ``site`` and the tracked path whose files it holds
    (``("remote_sglang_snapshot", "sglang/srt")`` for a copy of the inside of srt).
    """

    text: str
    path: Path
    site: str
    roots: tuple[tuple[str, str], ...]
    layout: str
    exclude: tuple[str, ...] = DEFAULT_EXCLUDE

    @property
    def tracked(self) -> tuple[str, ...]:
        return tuple(tracked for _, tracked in self.roots)

    def describe(self) -> str:
        """The mapping taken, for a line on stderr:
        ``./snap/ = sglang/srt/ (the inside of sglang/srt; --root to change)``."""
        inside = self.site != str(self.path)
        base = self.text.rstrip("/")
        mapping = ", ".join(f"{base}/{'' if inside else disk + '/'} = {tracked}/" for disk, tracked in self.roots)
        how = self.layout if "--root" in self.layout else f"{self.layout}; --root to change"
        return f"{mapping} ({how})"

    def spec(self) -> NodeSpec:
        """The synthetic local node that reads this folder (its paths are the folders on disk)."""
        return NodeSpec(name=self.text, site_packages=self.site, local=True,
                        paths=tuple(disk for disk, _ in self.roots), exclude=self.exclude)

    def to_json(self) -> dict[str, object]:
        return {"folder": str(self.path), "layout": self.layout,
                "roots": [{"disk": disk, "tracked": tracked} for disk, tracked in self.roots]}


def is_folder_text(text: str) -> bool:
    """True when a ref is written as a folder: it starts with ``.``, ``/`` or ``~``, or it
    holds a ``/`` and is an existing directory (``tags/v1`` stays a ref unless a folder)."""
    if text.startswith((".", "/", "~")):
        return True
    return "/" in text and os.path.isdir(text)


def tracked_paths(config: Config) -> tuple[str, ...]:
    """Every tracked path of the configured nodes, in config order (default ``sglang/srt``)."""
    found = dict.fromkeys(path for spec in config.nodes.values() for path in spec.paths)
    return tuple(found) or DEFAULT_PATHS


def resolve_folder(text: str, config: Config, store: Store | None = None, root: str | None = None,
                   tracked: Iterable[str] | None = None) -> FolderTree:
    """The folder ``text`` names, matched to the tracked paths (``root``: ``--root PREFIX``).

    RefError (exit 2) when it does not exist, is not a readable folder, or holds none of
    the tracked paths; the message names the path and what was looked for.
    """
    wanted = tuple(tracked) if tracked is not None else tracked_paths(config)
    exclude = next(iter(config.nodes.values())).exclude if config.nodes else DEFAULT_EXCLUDE
    given = Path(os.path.expanduser(text))
    looked_for = _layouts_text(wanted)
    if not given.exists():
        raise RefError(f"no such folder: {text} (expected a folder holding {looked_for})", hint=FOLDER_HINT)
    if not given.is_dir():
        raise RefError(f"{text} is not a folder (expected a folder holding {looked_for})", hint=FOLDER_HINT)
    folder = given.resolve()
    if not os.access(folder, os.R_OK | os.X_OK):
        raise RefError(f"folder {text} is not readable (permission denied)",
                       hint="snapver reads the folder as you: check its permissions")
    if root is not None:
        roots, layout = _roots_at(folder, text, root, wanted)
    else:
        roots, layout = _match_roots(folder, wanted, lambda path: _known_names(store, path))
        if not roots:
            raise RefError(f"folder {text} holds none of the tracked paths: looked for {looked_for}",
                           hint="say where its root is with --root PREFIX, e.g. --root " + wanted[0])
    if any(disk == "" for disk, _ in roots):  # the folder is the tracked path: read it from its parent
        site = folder.parent
        roots = tuple((folder.name if disk == "" else disk, path) for disk, path in roots)
    else:
        site = folder
    return FolderTree(text, folder, str(site), roots, layout, exclude)


def _layouts_text(wanted: tuple[str, ...]) -> str:
    first = wanted[0]
    parts = first.split("/")
    forms = [f"{first}/"] + [f"{'/'.join(parts[k:])}/" for k in range(1, len(parts))] + [f"python/{first}/"]
    return ", ".join(forms) + f" or the inside of {first}" + (
        f" (or of {', '.join(wanted[1:])})" if len(wanted) > 1 else "")


def _match_roots(folder: Path, wanted: tuple[str, ...],
                 known_names: Callable[[str], set[str]]) -> tuple[tuple[tuple[str, str], ...], str]:
    """``((disk below the site, tracked path), ...)`` and the layout's name, or ``((), "")``."""
    if folder.parent != folder:
        holding = tuple((path, path) for path in wanted if (folder / path).is_dir())
        if holding:
            return holding, "a site-packages"
        checkout = tuple((f"python/{path}", path) for path in wanted if (folder / "python" / path).is_dir())
        if checkout:
            return checkout, "a source checkout"
    for path in wanted:
        parts = path.split("/")
        for cut in range(1, len(parts)):
            below = "/".join(parts[cut:])
            if (folder / below).is_dir():
                return ((below, path),), f"a copy of {'/'.join(parts[:cut])}/"
    for path in wanted:
        if folder.parent != folder and _looks_inside(folder, known_names(path)):
            return (("", path),), f"the inside of {path}"
    return (), ""


def _looks_inside(folder: Path, known: set[str]) -> bool:
    """True when ``folder`` seems to be a tracked folder itself: it holds a name a snapshot
    has there, or (no snapshot to ask) Python files at its top or one level down."""
    try:
        names = {entry.name: entry for entry in os.scandir(folder)}
    except OSError:
        return False
    if known:
        return bool(known & set(names))
    for name, entry in names.items():
        if name.endswith(".py") and entry.is_file(follow_symlinks=False):
            return True
        if entry.is_dir(follow_symlinks=False):
            try:
                if any(child.endswith(".py") for child in os.listdir(entry.path)):
                    return True
            except OSError:
                continue
    return False


def _known_names(store: Store | None, path: str) -> set[str]:
    """The names directly inside tracked path ``path`` in the nodes' newest snapshots."""
    if store is None:
        return set()
    names: set[str] = set()
    for head in list(store.refs(store_refs.NODES).values())[:4]:
        try:
            names.update(store.git("ls-tree", "--name-only", "-z", f"{head}:{path}").decode(
                "utf-8", "surrogateescape").split("\0"))
        except StoreError:  # a snapshot without that path
            continue
    names.discard("")
    return names


def _roots_at(folder: Path, text: str, root: str, wanted: tuple[str, ...]) -> tuple[tuple[tuple[str, str], ...], str]:
    """The roots when ``--root PREFIX`` says the folder is ``site-packages/PREFIX``."""
    prefix = root.strip().strip("/")
    if prefix in ("", "."):
        holding = tuple((path, path) for path in wanted if (folder / path).is_dir())
        if not holding:
            raise RefError(f"--root {root!r} says {text} is a site-packages, but it holds none of "
                           f"{', '.join(p + '/' for p in wanted)}")
        return holding, "a site-packages, by --root ."
    if prefix in wanted:
        return (("", prefix),), f"the inside of {prefix}, by --root {prefix}"
    for path in wanted:
        if path.startswith(prefix + "/"):
            below = path[len(prefix) + 1:]
            if not (folder / below).is_dir():
                raise RefError(f"--root {root!r} says {text} is {prefix}/, but it has no {below}/ folder")
            return ((below, path),), f"a copy of {prefix}/, by --root {prefix}"
    raise RefError(f"--root {root!r} is not a tracked path or a folder above one",
                   hint=f"tracked: {', '.join(wanted)}; the root of a site-packages is --root .")
