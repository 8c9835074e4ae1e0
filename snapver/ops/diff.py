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
import os
import stat
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from snapver.config import Config
from snapver.environment import EnvChange, Environment, env_changes, ground_changes
from snapver.errors import UsageError
from snapver.model import (
    ADDED,
    DELETED,
    FILE,
    LINK,
    MODIFIED,
    TYPE_CHANGED,
    ZERO_OID,
    Change,
    Entry,
    Manifest,
    compare_manifests,
    quote_path,
)
from snapver.ops.envrecord import live_environment, snapshot_environment
from snapver.ops.scope import LeftOut, unrecorded_note, within_both
from snapver.ops.trees import (
    Side,
    load_sides,
    match_operand,
    normalize_paths,
    read_contents,
    select_paths,
    side_scope,
    tracked_roots,
)
from snapver.refs import Resolver, TreeRef
from snapver.store.repo import Store
from snapver.transport.connect import Starting
from snapver.unidiff import split_lines

BINARY_SNIFF = 8000  # git's rule: a NUL in the first 8000 bytes makes a file binary
# A file above this is shown as binary without being read (git's core.bigFileThreshold
# rule, at a size that keeps a diff of two versions within ~100 MiB of memory).
DIFF_WHOLE_MAX = 16 << 20


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
    # With paths after `--`: each operand → the files it matched (in either tree), and
    # the matched files that are the same in both trees.
    matched: dict[str, list[str]] = field(default_factory=dict)
    same: list[str] = field(default_factory=list)
    # Files outside one side's scope (excluded when a snapshot was taken, or by a node's
    # config now): neither compared nor reported as changes.
    not_compared: list[LeftOut] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # one line each, for stderr
    # What moved under the trees, when both sides have an environment (GPU and driver aside).
    env_changes: list[EnvChange] | None = None

    @property
    def compared(self) -> list[str]:
        """Every file the path operands matched, sorted (empty without operands)."""
        return sorted({path for paths in self.matched.values() for path in paths}, key=os.fsencode)

    @property
    def folders(self) -> list[Any]:
        """The sides that are local folders (their mapping is worth a line on stderr)."""
        return [side.ref.folder for side in (self.a, self.b) if side.ref.folder is not None]

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
        left = sorted((path for out in self.not_compared for path in out.paths), key=os.fsencode)
        return {"a": self.a.to_json(), "b": self.b.to_json(), "paths": list(self.paths),
                "matched": self.matched, "same": self.same,
                "not_compared": {"count": len(left), "paths": left, "notes": self.notes},
                "identical": self.identical, "changes": changes,
                "environment": None if self.env_changes is None else [c.to_json() for c in self.env_changes],
                "exit_code": self.exit_code}


# -- the operation ---------------------------------------------------------------------------

def diff(store: Store | None, config: Config, a: str, b: str | None = None, paths: Sequence[str] = (),
         contents: bool = False, context: int = 3, checksum: bool = False, root: str | None = None,
         starting: Starting | None = None) -> DiffResult:
    """Compare two trees; with one ref, a node's newest snapshot against its live tree.

    Args:
        store: the store, or None when there is none yet (then only live nodes can be named).
        config: the loaded config (nodes).
        a, b: refs (see ``snapver.refs``); ``b`` None means "the live tree of a's node".
        paths: only these paths: files or folders relative to site-packages or to a tracked
            path, file names, or globs (see ``select_paths``).
        contents: also build unified-diff text and diffstat numbers (fetches changed files).
        context: lines of context in the unified diff.
        checksum: hash every live file on the node, ignoring what the last pull saw.
        root: where a folder ref's root sits below site-packages (``--root``), else matched.
        starting: connections to live nodes the caller began (a node's is used if it is read live).
    """
    filters = normalize_paths(paths)
    resolver = Resolver(store, config, folder_root=root)
    ref_a = resolver.tree(a)
    if b is None:
        ref_a, ref_b = _one_argument(store, config, resolver, ref_a)
    else:
        ref_b = resolver.tree(b)
    sides: list[Side] = []
    try:
        sides = load_sides(store, config, [ref_a, ref_b], checksum, starting, environments=True)
        side_a, side_b = sides
        _scope_to_folders(side_a, side_b)
        left_out, notes = _within_both_scopes(store, config, side_a, side_b)
        changes = compare_manifests(side_a.manifest, side_b.manifest)
        matched: dict[str, list[str]] = {}
        same: list[str] = []
        if filters:
            roots = tracked_roots(config, side_a, side_b)
            present = set(side_a.manifest.entries) | set(side_b.manifest.entries)
            matched = select_paths(filters, present, roots, f"{side_a.label} or {side_b.label}")
            chosen = {path for found in matched.values() for path in found}
            changes = [c for c in changes if c.path in chosen]
            differing = {c.path for c in changes}
            same = sorted((path for path in chosen if path not in differing), key=os.fsencode)
            left_out = _selected(left_out, filters, roots)
        notes += [out.note("not compared") for out in left_out]
        result = DiffResult(side_a, side_b, changes, tuple(filters), matched=matched, same=same,
                            not_compared=left_out, notes=notes)
        if side_a.environment is not None and side_b.environment is not None:
            result.env_changes = ground_changes(env_changes(side_a.environment, side_b.environment))
        if contents and changes:
            readable = [c for c in changes if not too_big_to_diff(c)]
            old_data = read_contents(store, side_a, [c.old for c in readable if c.old is not None])
            new_data = read_contents(store, side_b, [c.new for c in readable if c.new is not None])
            result.files = [file_diff(c, old_data.get(c.path), new_data.get(c.path), context,
                                      whole=not too_big_to_diff(c)) for c in changes]
        elif contents:
            result.files = []
        return result
    finally:
        for side in sides:
            if side.transport is not None:
                side.transport.close()


@dataclass
class EnvDiffResult:
    """What changed under two trees (``diff --env``)."""

    a: str  # how each side is named: ``ct200 (live)``, ``may22 (1a2b3c4d5e)``
    b: str
    changes: list[EnvChange]

    @property
    def exit_code(self) -> int:
        return 1 if self.changes else 0

    def to_json(self) -> dict[str, Any]:
        return {"a": self.a, "b": self.b, "changes": [c.to_json() for c in self.changes],
                "identical": not self.changes, "exit_code": self.exit_code}


def env_diff(store: Store | None, config: Config, a: str, b: str | None = None) -> EnvDiffResult:
    """The environments of two trees compared (snapshots that recorded one, or live nodes);
    with one ref, as ``diff``: a node's newest snapshot against it live."""
    resolver = Resolver(store, config)
    ref_a = resolver.tree(a)
    ref_a, ref_b = _one_argument(store, config, resolver, ref_a) if b is None else (ref_a, resolver.tree(b))
    with ThreadPoolExecutor(2) as pool:
        (label_a, env_a), (label_b, env_b) = pool.map(lambda ref: _side_environment(store, config, ref),
                                                      [ref_a, ref_b])
    return EnvDiffResult(label_a, label_b, env_changes(env_a, env_b))


def _side_environment(store: Store | None, config: Config, ref: TreeRef) -> tuple[str, Environment]:
    if ref.folder is not None:
        raise UsageError(f"{ref.text!r} is a folder: it has no environment to compare",
                         hint="name a node (live) or a snapshot")
    if ref.live_node is not None:
        return f"{ref.live_node} (live)", live_environment(config.node(ref.live_node))
    assert store is not None and ref.commit is not None
    commit = store.commit(ref.commit)
    found = snapshot_environment(store, commit.id, commit.meta)
    if found is None:
        raise UsageError(f"{ref.text} ({commit.short}) recorded no environment",
                         hint="a snapshot records one when its node's pull reads it (not with environment = "
                         "false, nor before snapver did): compare a newer snapshot, or the node live")
    return f"{ref.text} ({commit.short})", found


def _one_argument(store: Store | None, config: Config, resolver: Resolver,
                  ref: TreeRef) -> tuple[TreeRef, TreeRef]:
    """``diff NODE``: its newest snapshot → live; ``diff SNAPSHOT``: it → its node's live tree."""
    if ref.folder is not None:
        raise UsageError(f"{ref.text!r} is a folder: name the tree to compare it with",
                         hint=f"snapver diff {ref.text} NODE (or a snapshot, tag or date)")
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


def _scope_to_folders(*sides: Side) -> None:
    """A folder stands for some tracked paths only (a copy of srt): the other side's files
    outside them are left out, not reported as missing from the folder."""
    for folder in (side.ref.folder for side in sides if side.ref.folder is not None):
        inside = tuple(path + "/" for path in folder.tracked)
        for side in sides:
            if any(not path.startswith(inside) for path in side.manifest.entries):
                side.manifest = Manifest({path: entry for path, entry in side.manifest.entries.items()
                                          if path.startswith(inside)})


def _within_both_scopes(store: Store | None, config: Config, a: Side, b: Side) -> tuple[list[LeftOut], list[str]]:
    """Cut both sides to what both observed; what was left out, and a note per assumed scope."""
    scope_a, scope_b = a.scope, b.scope = side_scope(store, config, a), side_scope(store, config, b)
    a.manifest, b.manifest, left_out = within_both(a.manifest, b.manifest, scope_a, scope_b,
                                                   a.observed_by, b.observed_by)
    notes = [unrecorded_note(side.label, scope) for side, scope in ((a, scope_a), (b, scope_b)) if not scope.recorded]
    return left_out, notes


def _selected(left_out: list[LeftOut], filters: Sequence[str], roots: Sequence[str]) -> list[LeftOut]:
    """The files left out that the path operands name (the others were not asked about)."""
    kept = []
    for out in left_out:
        paths = sorted({path for operand in filters for path in match_operand(operand, out.paths, roots)},
                       key=os.fsencode)
        if paths:
            kept.append(LeftOut(out.side, paths, out.why))
    return kept


# -- unified diff text ---------------------------------------------------------------------------

def git_mode(entry: Entry) -> str:
    """The mode git prints in diff headers: 120000 for a link, else file type and permission bits."""
    if entry.kind == LINK:
        return "120000"
    bits = stat.S_IMODE(entry.mode)
    return f"{0o100000 | (bits or 0o644):o}"


def is_binary(data: bytes) -> bool:
    return b"\0" in data[:BINARY_SNIFF]


def too_big_to_diff(change: Change) -> bool:
    """True when a side of ``change`` is above DIFF_WHOLE_MAX: compared by blob id, never read."""
    return any(entry is not None and entry.size > DIFF_WHOLE_MAX for entry in (change.old, change.new))


def file_diff(change: Change, old_data: bytes | None, new_data: bytes | None, context: int = 3,
              whole: bool = True) -> FileDiff:
    """The git-style unified diff of one change, with its diffstat numbers.

    ``old_data``/``new_data`` are the contents (a link's target for a symlink); a type
    change (file ↔ link) is shown as a deletion and an addition, as git does. Not
    ``whole``: the contents were not read (too big): shown as binary, sized by the entries.
    """
    old, new = change.old, change.new
    if old is not None and new is not None and old.kind != new.kind:
        gone = file_diff(Change(change.path, DELETED, old, None), old_data, None, context, whole)
        made = file_diff(Change(change.path, ADDED, None, new), None, new_data, context, whole)
        return FileDiff(change, gone.text + made.text, gone.added + made.added, gone.removed + made.removed,
                        gone.binary or made.binary, gone.old_size, made.new_size)
    old_bytes = old_data or b""
    new_bytes = new_data or b""
    a_name = quote_path("a/" + change.path)
    b_name = quote_path("b/" + change.path)
    lines = [b"diff --git %s %s\n" % (_enc(a_name), _enc(b_name))]
    old_oid = old.oid if old is not None else ZERO_OID
    new_oid = new.oid if new is not None else ZERO_OID
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
    if whole:
        old_size, new_size = len(old_bytes), len(new_bytes)
    else:
        old_size, new_size = (old.size if old is not None else 0), (new.size if new is not None else 0)
    if old_oid == new_oid:
        return FileDiff(change, b"".join(lines), old_size=old_size, new_size=new_size)
    from_name = _tab_if_space(a_name) if old is not None else "/dev/null"
    to_name = _tab_if_space(b_name) if new is not None else "/dev/null"
    if not whole or is_binary(old_bytes) or is_binary(new_bytes):
        lines.append(b"Binary files %s and %s differ\n" % (
            _enc(a_name if old is not None else "/dev/null"), _enc(b_name if new is not None else "/dev/null")))
        return FileDiff(change, b"".join(lines), binary=True, old_size=old_size, new_size=new_size)
    old_lines, new_lines = split_lines(old_bytes), split_lines(new_bytes)
    hunks, added, removed = unified_hunks(old_lines, new_lines, context)
    if hunks:
        lines.append(b"--- %s\n+++ %s\n" % (_enc(from_name), _enc(to_name)))
        lines.extend(hunks)
    return FileDiff(change, b"".join(lines), added, removed, old_size=old_size, new_size=new_size)


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


__all__ = ["ADDED", "DELETED", "FILE", "MODIFIED", "TYPE_CHANGED", "DiffResult", "FileDiff", "diff", "file_diff",
           "split_lines", "unified_hunks"]
