"""nodes add / nodes rm: edit the config file, keeping its comments and layout.

tomlkit reads and writes TOML round-trip (comments, order, spacing kept); the standard
library's tomllib only reads. The edited text is checked with the config loader before
anything is written; the write is a temporary file renamed over the config while an
exclusive lock on the file is held, after checking that its bytes are still those the
edit started from (compare-and-swap: an editor's save in between is never lost).
"""

from __future__ import annotations

import errno
import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapver.config import Config, find_config_path, parse_config
from snapver.errors import ConfigError, UsageError

LOCK_WAIT = 10.0  # seconds a second `nodes add`/`rm` waits for the first


@dataclass(frozen=True)
class EditHooks:
    """Callbacks of an edit: ``waiting`` once if another snapver holds the file's lock;
    ``before_write`` once the new text is beside the old, before the compare-and-swap."""

    waiting: Callable[[], None] | None = None
    before_write: Callable[[], None] | None = None


@dataclass(frozen=True)
class ConfigEdit:
    """What an edit did: the file, the node, and the groups it was taken out of."""

    path: Path
    action: str  # "added" | "removed"
    node: str
    groups_left: list[str] = field(default_factory=list)  # groups the node was taken out of
    groups_dropped: list[str] = field(default_factory=list)  # groups left empty, so removed

    def to_json(self) -> dict[str, Any]:
        return {"config": str(self.path), "action": self.action, "node": self.node,
                "groups_left": self.groups_left, "groups_dropped": self.groups_dropped, "exit_code": 0}


def config_file(explicit: str | None) -> Path:
    """The config file an edit writes: the one commands read; none found is an error."""
    path = find_config_path(explicit)
    if path is None:
        raise ConfigError(f"no .snapver here or in a parent of {Path.cwd()}, so there is no config to edit",
                          hint="snapver init (writes one here), or --config FILE")
    return path


def add_node(path: Path, name: str, table: dict[str, Any], hooks: EditHooks | None = None) -> ConfigEdit:
    """Add ``[nodes.NAME]`` holding ``table``; a name already used (node or group) is refused."""
    import tomlkit

    def edit(document: Any) -> None:
        nodes = document.get("nodes")
        if nodes is not None and name in nodes:
            raise UsageError(f"node {name!r} is already in {path}",
                             hint=f"snapver nodes rm {name} first, or edit {path}")
        if name in (document.get("groups") or {}):
            raise UsageError(f"{name!r} is a group in {path}; a node cannot share its name")
        if nodes is None:
            nodes = document["nodes"] = tomlkit.table(is_super_table=True)
        entry = tomlkit.table()
        for key, value in table.items():
            entry.add(key, value)
        entry.add(tomlkit.nl())  # a blank line before whatever table follows
        nodes.add(name, entry)

    _edit(path, edit, hooks or EditHooks())
    return ConfigEdit(path, "added", name)


def remove_node(path: Path, name: str, from_groups: bool = False, hooks: EditHooks | None = None) -> ConfigEdit:
    """Remove ``[nodes.NAME]``. A group naming it is refused (naming the group) unless
    ``from_groups``: then it leaves those groups, and a group left empty is removed."""
    left: list[str] = []
    dropped: list[str] = []

    def edit(document: Any) -> None:
        nodes = document.get("nodes")
        if nodes is None or name not in nodes:
            known = ", ".join(sorted(nodes or {})) or "(none)"
            raise UsageError(f"no node {name!r} in {path}", hint=f"nodes: {known}")
        left[:], dropped[:] = _leave_groups(document, name, from_groups, path)
        del nodes[name]

    _edit(path, edit, hooks or EditHooks())
    return ConfigEdit(path, "removed", name, left, dropped)


def _leave_groups(document: Any, name: str, from_groups: bool, path: Path) -> tuple[list[str], list[str]]:
    """Take ``name`` out of every group naming it (``from_groups``), else refuse naming them."""
    from snapver.noderange import expand, is_range

    groups = document.get("groups") or {}
    left, dropped = [], []
    for group, value in list(groups.items()):
        members = value.get("nodes", []) if hasattr(value, "get") else value
        if any(is_range(m) and name in expand(m) for m in members):
            raise UsageError(f"group {group!r} names {name!r} through a node range in {path}",
                             hint=f"edit the range in {path} first")
        if name not in members:
            continue
        if not from_groups:
            raise UsageError(f"node {name!r} is in group {group!r}: removing it would break the group",
                             hint=f"snapver nodes rm {name} --from-groups (takes it out of the group too)")
        members.remove(name)
        left.append(group)
        if not members:
            del groups[group]
            dropped.append(group)
    return left, dropped


def _edit(path: Path, change: Callable[[Any], None], hooks: EditHooks) -> None:
    """Read, change, validate and write the config under its lock, as compare-and-swap."""
    import tomlkit

    with _locked(path, hooks.waiting) as (handle, original):
        try:
            document = tomlkit.parse(original.decode("utf-8"))
        except (UnicodeDecodeError, tomlkit.exceptions.ParseError) as exc:
            raise ConfigError(f"{path}: not valid TOML: {exc}", hint="fix it by hand first") from None
        change(document)
        text = tomlkit.dumps(document)
        text += "" if text.endswith("\n") or not text else "\n"
        _validate(text, path)
        _replace(path, handle, original, text.encode("utf-8"), hooks.before_write)


def _validate(text: str, path: Path) -> Config:
    """The edited text as the config loader reads it: a bad result is refused, not written."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib
    return parse_config(tomllib.loads(text), path)


@contextmanager
def _locked(path: Path, waiting: Callable[[], None] | None) -> Iterator[tuple[int, bytes]]:
    """The config opened without following a link, locked, and its bytes. A file renamed
    over by the writer before us is opened again (its lock was on the old inode)."""
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        handle = _open_config(path)
        try:
            _lock(handle, path, deadline, waiting)
            waiting = None  # said once
            if os.fstat(handle).st_ino == os.stat(path, follow_symlinks=False).st_ino:
                yield handle, _read_all(handle)
                return
        finally:
            os.close(handle)


def _open_config(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise ConfigError(f"{path} is a symbolic link: snapver edits only the file itself",
                              hint=f"--config {os.path.realpath(path)}") from None
        raise ConfigError(f"{path}: cannot open: {exc.strerror}") from None


def _lock(handle: int, path: Path, deadline: float, waiting: Callable[[], None] | None) -> None:
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if waiting is not None:
                waiting()
                waiting = None
            if time.monotonic() > deadline:
                raise ConfigError(f"{path} is being edited by another snapver for over {LOCK_WAIT:.0f} s",
                                  hint="try again when it is done") from None
            time.sleep(0.05)


def _read_all(handle: int) -> bytes:
    pieces = []
    while piece := os.read(handle, 1 << 16):
        pieces.append(piece)
    return b"".join(pieces)


def _replace(path: Path, handle: int, original: bytes, data: bytes, before_write: Callable[[], None] | None) -> None:
    """Write ``data`` beside the config and rename it over, if the file still holds ``original``."""
    folder = path.parent
    temporary = folder / f".{path.name}.tmp-{os.getpid()}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    out = os.open(temporary, flags, os.fstat(handle).st_mode & 0o7777)
    try:
        try:
            os.write(out, data)
            os.fsync(out)
        finally:
            os.close(out)
        if before_write is not None:
            before_write()
        os.lseek(handle, 0, os.SEEK_SET)
        if _read_all(handle) != original or os.stat(path, follow_symlinks=False).st_ino != os.fstat(handle).st_ino:
            raise ConfigError(f"{path} changed while it was edited: nothing written",
                              hint="run the command again (it reads the file anew)")
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
