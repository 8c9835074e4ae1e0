"""Pure git object encoding: blob, tree and commit ids and bytes, as git writes them; no I/O."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from snapver.model import quote_path
from snapver.store.pack import BLOB_TYPE, TREE_TYPE, object_id

IDENTITY = "snapver <snapver@localhost>"


def blob_oid(data: bytes) -> str:
    """The git blob id of ``data`` (what ``git hash-object`` prints)."""
    return object_id(BLOB_TYPE, data).hex()


def tree_objects(leaves: Iterable[tuple[str, str, str]]) -> tuple[str, list[tuple[str, bytes]]]:
    """The git trees holding ``leaves`` (path, git mode, hex blob id), as ``git write-tree`` makes them.

    Returns the root tree's id and every tree as (id, content), subtrees first.
    ValueError for a path git cannot keep (an empty, ``.`` or ``..`` part, a NUL) or one
    that is both a file and a folder.
    """
    root: dict[bytes, Any] = {}
    folders: dict[bytes, dict[bytes, Any]] = {b"": root}

    def folder(path: bytes) -> dict[bytes, Any]:
        node = folders.get(path)
        if node is None:
            parent, _, name = path.rpartition(b"/")
            _check_name(name, path)
            above = folder(parent)
            node = above.setdefault(name, {})
            if not isinstance(node, dict):
                raise ValueError(f"{_show(path)} is both a file and a folder")
            folders[path] = node
        return node

    for path, mode, oid in leaves:
        raw = path.encode("utf-8", "surrogateescape")
        parent, _, name = raw.rpartition(b"/")
        _check_name(name, raw)
        node = folder(parent)
        if name in node:
            raise ValueError(f"{_show(raw)} is both a file and a folder" if isinstance(node[name], dict)
                             else f"{_show(raw)} is named twice")
        node[name] = (mode.encode(), bytes.fromhex(oid))

    trees: list[tuple[str, bytes]] = []

    def write(node: dict[bytes, Any]) -> bytes:
        rows = []
        for name, value in node.items():
            if isinstance(value, dict):
                rows.append((name + b"/", b"40000 %s\0%s" % (name, write(value))))
            else:
                rows.append((name, b"%s %s\0%s" % (value[0], name, value[1])))
        rows.sort()
        body = b"".join(row for _, row in rows)
        oid = object_id(TREE_TYPE, body)
        trees.append((oid.hex(), body))
        return oid

    return write(root).hex(), trees


def _check_name(name: bytes, path: bytes) -> None:
    if name in (b"", b".", b"..") or b"\0" in name:
        raise ValueError(f"git cannot keep the path {_show(path)}")


def _show(path: bytes) -> str:
    return quote_path(path.decode("utf-8", "surrogateescape"))


def commit_object(tree: str, parent: str | None, message: str, when: datetime, also: tuple[str, ...] = ()) -> bytes:
    """A commit as ``git fast-import`` writes one with only a committer (who is also the author)."""
    stamp = int(when.timestamp())
    offset = when.astimezone().utcoffset()
    minutes = int(offset.total_seconds() // 60) if offset else 0
    tz = f"{'+' if minutes >= 0 else '-'}{abs(minutes) // 60:02d}{abs(minutes) % 60:02d}"
    who = f"{IDENTITY} {stamp} {tz}"
    parents = "".join(f"parent {p}\n" for p in (parent, *also) if p)
    head = f"tree {tree}\n" + parents + f"author {who}\ncommitter {who}\n\n"
    return head.encode() + message.encode("utf-8", "surrogateescape")
