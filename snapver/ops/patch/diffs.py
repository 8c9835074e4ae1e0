"""Patches as unified diffs: exporting one (made by git), importing one exactly onto a base."""

from __future__ import annotations

import stat
from collections.abc import Iterable
from typing import Any

from snapver.config import Config
from snapver.errors import PatchError
from snapver.model import FILE, LINK, Entry, is_safe_relpath
from snapver.ops.patch.model import (
    Base,
    Patch,
    build_tree,
    check_new_name,
    check_targets,
    entry_for,
    load_patch,
    patch_meta,
    resolve_base,
    with_warnings,
    within_tracked,
    write_patch_commit,
)
from snapver.store.objects import blob_oid
from snapver.store.repo import Store
from snapver.unidiff import FileDiff, apply_delta, apply_hunks, check_delta_base, parse_diff

EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's id of the empty tree


def export_patch(store: Store, name: str) -> bytes:
    """The patch as a git-style unified diff (``git apply`` / ``patch -p1`` in site-packages).

    Made by git itself from the two trees in the store, so quoting of odd names,
    modes, new and deleted files and binary content are exactly what git writes.
    """
    patch = load_patch(store, name, with_files=False)
    flags = ("-c", "core.quotePath=true", "-c", "diff.noprefix=false", "-c", "diff.mnemonicPrefix=false",
             "diff", "--no-renames", "--binary", "--full-index", "--no-ext-diff", "--no-textconv",
             "--no-color", "--src-prefix=a/", "--dst-prefix=b/")
    keeps = patch.meta.get("keeps") or []
    kept = [f.path for f in load_patch(store, name).files if f.base is None and f.path in keeps] if keeps else []
    changed = store.git(*flags, patch.base, patch.commit, "--", ".", ":(exclude).snapver")
    # Files a rebase kept (the base holds them only as leftovers): added, from nothing.
    added = store.git(*flags, EMPTY_TREE, patch.commit, "--", *(f":(literal){p}" for p in kept)) if kept else b""
    return changed + added



def _strip(name: str, level: int) -> str | None:
    parts = name.split("/")
    return "/".join(parts[level:]) if len(parts) > level else None


def _check_unsafe(diff: FileDiff, source: str) -> None:
    for name in (diff.old_path, diff.new_path):
        if name is None:
            continue
        if name.startswith("/") or ".." in name.split("/") or "\0" in name:
            raise PatchError(f"{source}, line {diff.line}: unsafe path {name!r} (absolute or with '..')",
                             hint="paths must be relative to site-packages")


def _resolve_names(
    diffs: list[FileDiff], base: Base, strip: int | None, source: str
) -> list[tuple[str | None, str | None]]:
    """Each diff's (old, new) path relative to site-packages: the smallest prefix strip
    (like ``patch -pN``) that makes every name fit the base."""

    def at(level: int) -> tuple[list[tuple[str | None, str | None]], list[str]]:
        names, problems = [], []
        for diff in diffs:
            old = _strip(diff.old_path, level) if diff.old_path is not None else None
            new = _strip(diff.new_path, level) if diff.new_path is not None else None
            if (diff.old_path is not None and old is None) or (diff.new_path is not None and new is None):
                problems.append(f"{diff.new_path or diff.old_path}: too few path components for -p{level}")
                names.append((old, new))
                continue
            if diff.created and new is not None:
                if not within_tracked(new, base.paths):
                    problems.append(f"{new}: outside the tracked paths ({', '.join(base.paths)})")
            elif diff.deleted or diff.rename or diff.copy:
                if old not in base.manifest:
                    problems.append(f"{old}: not in the base")
                if new is not None and not within_tracked(new, base.paths):
                    problems.append(f"{new}: outside the tracked paths ({', '.join(base.paths)})")
            elif new in base.manifest:
                old = new
            elif old in base.manifest:
                new = old
            else:
                problems.append(f"{new}: not in the base")
            names.append((old, new))
        return names, problems

    levels = [strip] if strip is not None else [0, 1, 2, 3]
    tried = [(level, *at(level)) for level in levels]
    for _level, names, problems in tried:
        if not problems:
            return names
    level, _, problems = min(tried, key=lambda t: (len(t[2]), t[0]))
    raise PatchError(f"{source} does not fit base {base.commit[:10]} ({base.node}): {problems[0]}"
                     + (f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""),
                     hint="paths must be relative to site-packages (a/ b/ prefixes are fine); "
                     "is --base the snapshot the diff was made against?")


def _check_path_safety(path: str, state: dict[str, Entry | None], base: Base, source: str) -> None:
    if not is_safe_relpath(path):
        raise PatchError(f"{source}: unsafe path {path!r}")
    parts = path.split("/")
    for depth in range(1, len(parts)):
        prefix = "/".join(parts[:depth])
        entry = state[prefix] if prefix in state else base.manifest.get(prefix)
        if entry is not None and entry.kind == LINK:
            raise PatchError(f"{source}: {path} passes through the symlink {prefix}",
                             hint="snapver never writes through a symlink")
        if entry is not None:
            raise PatchError(f"{source}: {path}: {prefix} is a file, not a folder")
    if any(other.startswith(path + "/") for other in base.manifest.entries):
        raise PatchError(f"{source}: {path} is a folder in the base, not a file")


def _git_mode(entry: Entry) -> int:
    """The mode git records for an entry: 120000, 100755 (owner may execute) or 100644."""
    if entry.kind == LINK:
        return 0o120000
    return 0o100755 if entry.mode & 0o100 else 0o100644


def _mode_kind(git_mode: int | None, default: Entry | None) -> tuple[str, int]:
    # git's mode of the old entry says "unchanged": keep its exact bits (0o664 is git's 100644).
    if git_mode is None or (default is not None and git_mode == _git_mode(default)):
        return (default.kind, default.mode) if default is not None else (FILE, 0o100644)
    if stat.S_ISLNK(git_mode):
        return LINK, 0o120777
    return FILE, git_mode if git_mode & 0o170000 else stat.S_IFREG | git_mode


def _check_oid(path: str, claimed: str | None, actual: str, what: str, base: Base, source: str) -> None:
    if claimed and set(claimed) != {"0"} and not actual.startswith(claimed):
        raise PatchError(f"{source}: {path}: the diff was made against blob {claimed}, but the base "
                         f"{base.commit[:10]} ({base.node}) holds {actual[:len(claimed)]}"
                         if what == "old" else
                         f"{source}: {path}: applying the diff gives blob {actual[:len(claimed)]}, "
                         f"not the {claimed} its index line names",
                         hint="is --base the snapshot the diff was made against?")


def changes_from_diff(data: bytes, base: Base, source: str, strip: int | None = None,
                      read_blob: Any = None) -> tuple[dict[str, tuple[Entry | None, bytes | None]], str]:
    """Apply a unified diff to the base: ``(path → (new entry or None, content), subject)``."""
    parsed = parse_diff(data, source)
    for diff in parsed.files:
        _check_unsafe(diff, source)
    names = _resolve_names(parsed.files, base, strip, source)
    state: dict[str, Entry | None] = {}
    content: dict[str, bytes] = {}

    def current(path: str) -> tuple[Entry | None, bytes | None]:
        entry = state[path] if path in state else base.manifest.get(path)
        if entry is None:
            return None, None
        if path not in content:
            content[path] = read_blob(entry.oid)
        return entry, content[path]

    for diff, (old, new) in zip(parsed.files, names, strict=False):
        target = new if new is not None else old
        assert target is not None
        _check_path_safety(target, state, base, source)
        if old is not None:
            _check_path_safety(old, state, base, source)
        old_entry, old_data = current(old) if old is not None else (None, None)
        if old is not None and old_entry is None:
            raise PatchError(f"{source}: {old}: not in the base (or deleted earlier in the diff)")
        if old_entry is not None and old_entry.kind == LINK and (diff.old_mode is None or
                                                                 not stat.S_ISLNK(diff.old_mode)):
            raise PatchError(f"{source}: {old} is a symlink in the base; the diff treats it as a file",
                             hint="snapver never writes through a symlink")
        if old_entry is not None and old_entry.kind == FILE and diff.old_mode is not None \
                and stat.S_ISLNK(diff.old_mode):
            raise PatchError(f"{source}: {old} is a file in the base; the diff treats it as a symlink",
                             hint="is --base the snapshot the diff was made against?")
        if diff.created and current(target)[0] is not None:
            raise PatchError(f"{source}: {target}: the diff creates it, but it already exists in the base")
        if old is not None and old_entry is not None and diff.binary_delta is not None:
            check_delta_base(old, diff.old_oid, old_entry.oid, f"base {base.commit[:10]} ({base.node})", source)
        if old is not None and old_entry is not None:
            _check_oid(old, diff.old_oid, old_entry.oid, "old", base, source)
        if diff.binary is not None:
            new_data = diff.binary
        elif diff.binary_delta is not None:
            new_data = apply_delta(f"{source}: {target if old is None else old}", old_data or b"", diff.binary_delta)
        else:
            new_data = apply_hunks(target if old is None else old, old_data or b"", diff.hunks)
        if diff.deleted:
            assert old is not None  # a deletion names the file it deletes (unidiff)
            if new_data:
                raise PatchError(f"{source}: {old}: the diff deletes it but does not remove all of its lines",
                                 hint="is --base the snapshot the diff was made against?")
            state[old] = None
            continue
        kind, mode = _mode_kind(diff.new_mode, old_entry)
        _check_oid(target, diff.new_oid, blob_oid(new_data), "new", base, source)
        if diff.rename and old is not None and old != target:
            state[old] = None
        state[target] = entry_for(target, kind, mode, new_data)
        content[target] = new_data
    changes: dict[str, tuple[Entry | None, bytes | None]] = {}
    for path, entry in state.items():
        before = base.manifest.get(path)
        if entry is None:
            if before is not None:
                changes[path] = (None, None)
        elif before is None or (before.kind, before.oid, before.mode) != (entry.kind, entry.oid, entry.mode):
            changes[path] = (entry, content.get(path))
    return changes, parsed.subject


def import_patch(store: Store, config: Config, name: str, data: bytes, source: str, base_ref: str,
                 nodes: Iterable[str] = (), message: str = "", strip: int | None = None) -> Patch:
    """Make a patch from a unified diff applied exactly to the base snapshot."""
    check_new_name(store, config, name)
    targets = check_targets(config, nodes)
    base = resolve_base(store, config, base_ref)
    changes, subject = changes_from_diff(data, base, source, strip, store.read_blob)
    if not changes:
        raise PatchError(f"{source} changes nothing in base {base.commit[:10]}")
    manifest, blobs = build_tree(base.manifest, changes)
    meta = patch_meta(base, targets, message or subject, "import", len(changes))
    write_patch_commit(store, name, base.commit, manifest, blobs, meta, None)
    return with_warnings(store, load_patch(store, name))
