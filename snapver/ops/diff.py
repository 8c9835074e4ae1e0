"""diff: compare two trees — snapshots, patches or live nodes — exactly, by git blob id.

A live side is listed on its node, which hashes every tracked file (no stat cache: a
false "identical" is the worst bug this tool can have); a snapshot side is its stored
manifest. File contents cross the wire only for the files that differ, and only when
the output shows them (a unified diff or a diffstat). Nothing is written anywhere.

The text generator (:func:`file_diff`) is shared with patch export: its output applies
with ``git apply`` and ``patch -p1`` inside site-packages.
"""

from __future__ import annotations

import difflib
import fnmatch
import stat
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from snapver.config import Config
from snapver.errors import SnapverError, UsageError
from snapver.model import (ADDED, DELETED, FILE, LINK, MODIFIED, TYPE_CHANGED, Change, Entry, Manifest,
                           compare_manifests, is_safe_relpath, quote_path)
from snapver.ops.pull import list_live
from snapver.refs import Resolver, TreeRef
from snapver.unidiff import split_lines
from snapver.store.repo import Commit, Store
from snapver.transport.base import Listing, Transport
from snapver.transport.connect import open_transport

NULL_OID = "0" * 40
BINARY_SNIFF = 8000  # git's rule: a NUL in the first 8000 bytes makes a file binary


@dataclass
class Side:
    """One tree of a diff: what the ref named, and the tree as a manifest."""

    ref: TreeRef
    manifest: Manifest
    node: str | None = None
    commit: Commit | None = None
    transport: Transport | None = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        if self.ref.is_live:
            return "live"
        return str(self.commit.meta.get("kind", "snapshot")) if self.commit else "snapshot"

    @property
    def label(self) -> str:
        """How messages name this side: ``ct200 (live)`` or ``v1 (1a2b3c4d5e)``."""
        if self.ref.is_live:
            return f"{self.node} (live)"
        assert self.commit is not None
        return f"{self.ref.text} ({self.commit.short})"

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"ref": self.ref.text, "kind": self.kind, "node": self.node,
                                    "files": len(self.manifest)}
        if self.commit is not None:
            document.update(commit=self.commit.id, time=self.commit.time.astimezone().isoformat())
        return document


@dataclass(frozen=True)
class FileDiff:
    """One changed file as unified-diff text, with its diffstat numbers."""

    change: Change
    text: bytes
    added: int = 0
    removed: int = 0
    binary: bool = False
    old_size: int = 0
    new_size: int = 0


@dataclass
class DiffResult:
    """What differs between ``a`` and ``b`` (``changes`` sorted by path)."""

    a: Side
    b: Side
    changes: list[Change]
    paths: tuple[str, ...] = ()
    files: list[FileDiff] | None = None  # only when contents were asked for

    @property
    def identical(self) -> bool:
        return not self.changes

    @property
    def exit_code(self) -> int:
        return 0 if self.identical else 1

    def to_json(self) -> dict[str, Any]:
        def entry(e: Entry | None) -> dict[str, Any] | None:
            if e is None:
                return None
            return {"kind": e.kind, "mode": f"{e.mode:o}", "size": e.size, "oid": e.oid}

        changes = []
        stats = {c.change.path: c for c in self.files or []}
        for change in self.changes:
            item: dict[str, Any] = {"path": change.path, "status": change.status,
                                    "old": entry(change.old), "new": entry(change.new)}
            if change.path in stats:
                found = stats[change.path]
                item.update(binary=found.binary, added=found.added, removed=found.removed)
            changes.append(item)
        return {"a": self.a.to_json(), "b": self.b.to_json(), "paths": list(self.paths),
                "identical": self.identical, "changes": changes, "exit_code": self.exit_code}


# -- the operation ---------------------------------------------------------------------------

def diff(store: Store | None, config: Config, a: str, b: str | None = None, paths: Sequence[str] = (),
         contents: bool = False, context: int = 3, checksum: bool = False) -> DiffResult:
    """Compare two trees; with one ref, a node's newest snapshot against its live tree.

    Args:
        store: the store, or None when there is none yet (then only live nodes can be named).
        config: the loaded config (nodes).
        a, b: refs (see ``snapver.refs``); ``b`` None means "the live tree of a's node".
        paths: only these paths (files, folders or globs relative to site-packages).
        contents: also build unified-diff text and diffstat numbers (fetches changed files).
        context: lines of context in the unified diff.
        checksum: hash every live file on the node, ignoring what the last pull saw.
    """
    filters = normalize_paths(paths)
    resolver = Resolver(store, config)
    ref_a = resolver.tree(a)
    if b is None:
        ref_a, ref_b = _one_argument(store, config, resolver, ref_a)
    else:
        ref_b = resolver.tree(b)
    sides: list[Side] = []
    try:
        sides = _load_sides(store, config, [ref_a, ref_b], checksum)
        side_a, side_b = sides
        changes = compare_manifests(side_a.manifest, side_b.manifest)
        if filters:
            _check_filters(filters, side_a, side_b)
            changes = [c for c in changes if path_matches(c.path, filters)]
        result = DiffResult(side_a, side_b, changes, tuple(filters))
        if contents and changes:
            old_data = read_contents(store, side_a, [c.old for c in changes if c.old is not None])
            new_data = read_contents(store, side_b, [c.new for c in changes if c.new is not None])
            result.files = [file_diff(c, old_data.get(c.path), new_data.get(c.path), context) for c in changes]
        elif contents:
            result.files = []
        return result
    finally:
        for side in sides:
            if side.transport is not None:
                side.transport.close()


def _one_argument(store: Store | None, config: Config, resolver: Resolver,
                  ref: TreeRef) -> tuple[TreeRef, TreeRef]:
    """``diff NODE``: its newest snapshot → live; ``diff SNAPSHOT``: it → its node's live tree."""
    if ref.is_live:
        assert ref.live_node is not None
        newest = resolver.snapshot(f"{ref.live_node}@latest")
        return TreeRef(f"{ref.live_node}@latest", commit=newest), ref
    assert store is not None and ref.commit is not None
    node = store.commit(ref.commit).meta.get("node")
    if not node or node not in config.nodes:
        raise UsageError(f"{ref.text!r} is not a snapshot of a configured node, so it has no live tree to "
                         "compare with", hint="name two trees: snapver diff A B")
    return ref, TreeRef(f"{node}@live", live_node=node)


def _load_sides(store: Store | None, config: Config, trees: list[TreeRef], checksum: bool = False) -> list[Side]:
    """Both sides' manifests, loaded in parallel: a live node hashes its files while the
    store is read (or while the other node hashes its own)."""
    sides = [Side(tree, Manifest()) for tree in trees]

    def load(side: Side) -> SnapverError | None:
        try:
            if side.ref.is_live:
                assert side.ref.live_node is not None
                side.node = side.ref.live_node
                side.transport = open_transport(config.node(side.node)).start()
                side.manifest = live_manifest(list_live(store, side.transport, checksum))
            else:
                assert store is not None and side.ref.commit is not None
                side.commit = store.commit(side.ref.commit)
                side.node = side.commit.meta.get("node")
                side.manifest = store.manifest(side.ref.commit)
        except SnapverError as exc:
            return exc
        return None

    with ThreadPoolExecutor(len(sides)) as pool:
        errors = [error for error in pool.map(load, sides) if error is not None]
    if errors:
        for side in sides:
            if side.transport is not None:
                side.transport.close()
        raise errors[0]
    return sides


def live_manifest(listing: Listing) -> Manifest:
    """A node's listing as a manifest keyed by git blob id (``digest`` is not known live)."""
    return Manifest.of(Entry(e.path, e.kind, e.mode, e.size, "", e.oid) for e in listing.entries)


def read_contents(store: Store | None, side: Side, entries: Iterable[Entry]) -> dict[str, bytes]:
    """``{path: content}`` of ``entries`` from the side's node (one stream) or the store."""
    wanted = list(entries)
    if not wanted:
        return {}
    if side.transport is not None:
        return {path: data for path, kind, data in side.transport.read_files([e.path for e in wanted])
                if kind is not None}
    assert store is not None
    blobs = dict(store.read_blobs(e.oid for e in wanted))
    return {e.path: blobs[e.oid] for e in wanted}


# -- path filters ------------------------------------------------------------------------------

def normalize_paths(paths: Sequence[str]) -> list[str]:
    """Clean path filters (relative to site-packages); refuse absolute paths and ``..``."""
    cleaned = []
    for raw in paths:
        path = raw.strip()
        while path.startswith("./"):
            path = path[2:]
        path = path.rstrip("/")
        if not path or not is_safe_relpath(path):
            raise UsageError(f"bad path {raw!r}: paths are relative to site-packages, without '..'",
                             hint="e.g. sglang/srt/speculative")
        cleaned.append(path)
    return cleaned


def path_matches(path: str, filters: Sequence[str]) -> bool:
    """True when ``path`` is a filter, lies inside one, or matches one as a glob."""
    for pattern in filters:
        if path == pattern or path.startswith(pattern + "/"):
            return True
        if any(ch in pattern for ch in "*?[") and fnmatch.fnmatchcase(path, pattern):
            return True
    return False


def _check_filters(filters: Sequence[str], a: Side, b: Side) -> None:
    """A filter that matches no file in either tree is a typo, not "identical"."""
    for pattern in filters:
        if not any(path_matches(path, [pattern]) for side in (a, b) for path in side.manifest.entries):
            raise UsageError(f"path {pattern!r} matches no file in {a.label} or {b.label}",
                             hint="paths are relative to site-packages, e.g. sglang/srt/server_args.py")


# -- unified diff text ---------------------------------------------------------------------------

def git_mode(entry: Entry) -> str:
    """The mode git prints in diff headers: 120000 for a link, else file type and permission bits."""
    if entry.kind == LINK:
        return "120000"
    bits = stat.S_IMODE(entry.mode)
    return f"{0o100000 | (bits or 0o644):o}"


def is_binary(data: bytes) -> bool:
    return b"\0" in data[:BINARY_SNIFF]


def file_diff(change: Change, old_data: bytes | None, new_data: bytes | None, context: int = 3) -> FileDiff:
    """The git-style unified diff of one change, with its diffstat numbers.

    ``old_data``/``new_data`` are the contents (a link's target for a symlink); a type
    change (file ↔ link) is shown as a deletion and an addition, as git does.
    """
    old, new = change.old, change.new
    if old is not None and new is not None and old.kind != new.kind:
        gone = file_diff(Change(change.path, DELETED, old, None), old_data, None, context)
        made = file_diff(Change(change.path, ADDED, None, new), None, new_data, context)
        return FileDiff(change, gone.text + made.text, gone.added + made.added, gone.removed + made.removed,
                        gone.binary or made.binary, gone.old_size, made.new_size)
    old_bytes = old_data or b""
    new_bytes = new_data or b""
    a_name = quote_path("a/" + change.path)
    b_name = quote_path("b/" + change.path)
    lines = [b"diff --git %s %s\n" % (_enc(a_name), _enc(b_name))]
    old_oid = old.oid if old is not None else NULL_OID
    new_oid = new.oid if new is not None else NULL_OID
    index = b"index %s..%s" % (old_oid[:7].encode(), new_oid[:7].encode())
    if old is None:
        assert new is not None
        lines.append(b"new file mode %s\n" % git_mode(new).encode())
        lines.append(index + b"\n")
    elif new is None:
        lines.append(b"deleted file mode %s\n" % git_mode(old).encode())
        lines.append(index + b"\n")
    else:
        if git_mode(old) != git_mode(new):
            lines.append(b"old mode %s\nnew mode %s\n" % (git_mode(old).encode(), git_mode(new).encode()))
            if old_oid != new_oid:
                lines.append(index + b"\n")
        elif old_oid != new_oid:
            lines.append(index + b" %s\n" % git_mode(old).encode())
    result = dict(old_size=len(old_bytes), new_size=len(new_bytes))
    if old_oid == new_oid:
        return FileDiff(change, b"".join(lines), **result)
    from_name = _tab_if_space(a_name) if old is not None else "/dev/null"
    to_name = _tab_if_space(b_name) if new is not None else "/dev/null"
    if is_binary(old_bytes) or is_binary(new_bytes):
        lines.append(b"Binary files %s and %s differ\n" % (
            _enc(a_name if old is not None else "/dev/null"), _enc(b_name if new is not None else "/dev/null")))
        return FileDiff(change, b"".join(lines), binary=True, **result)
    old_lines, new_lines = split_lines(old_bytes), split_lines(new_bytes)
    hunks, added, removed = unified_hunks(old_lines, new_lines, context)
    if hunks:
        lines.append(b"--- %s\n+++ %s\n" % (_enc(from_name), _enc(to_name)))
        lines.extend(hunks)
    return FileDiff(change, b"".join(lines), added, removed, **result)


def unified_hunks(old: list[bytes], new: list[bytes], context: int = 3) -> tuple[list[bytes], int, int]:
    """Unified-diff hunks (``@@`` headers and lines) between two line lists; and +/- counts."""
    out: list[bytes] = []
    added = removed = 0
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        first, last = group[0], group[-1]
        out.append(b"@@ -%s +%s @@\n" % (_range(first[1], last[2]), _range(first[3], last[4])))
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out.extend(_line(b" ", line) for line in old[i1:i2])
                continue
            if tag in ("replace", "delete"):
                out.extend(_line(b"-", line) for line in old[i1:i2])
                removed += i2 - i1
            if tag in ("replace", "insert"):
                out.extend(_line(b"+", line) for line in new[j1:j2])
                added += j2 - j1
    return out, added, removed


def _line(prefix: bytes, line: bytes) -> bytes:
    if line.endswith(b"\n"):
        return prefix + line
    return prefix + line + b"\n\\ No newline at end of file\n"


def _range(start: int, stop: int) -> bytes:
    length = stop - start
    if length == 1:
        return b"%d" % (start + 1)
    return b"%d,%d" % (start + 1 if length else start, length)


def _tab_if_space(name: str) -> str:
    # git ends a ---/+++ name that holds a space with a tab, so that patch(1) reads it whole.
    return name + "\t" if " " in name else name


def _enc(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


__all__ = ["ADDED", "DELETED", "FILE", "MODIFIED", "TYPE_CHANGED", "DiffResult", "FileDiff", "Side", "diff",
           "file_diff", "live_manifest", "normalize_paths", "path_matches", "split_lines", "unified_hunks"]
