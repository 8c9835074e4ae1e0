"""Patches: named changes on top of a base snapshot, kept as commits in the store.

A patch is a commit on ``refs/heads/patches/<name>`` whose tree is the base tree with
the change applied (and ``.snapver/manifest`` updated); its first commit's parent is
the base snapshot, and every `patch save` adds a commit on top, so `git log` shows the
patch's history. The base, the default target nodes and the message live in the commit
metadata (kind "patch"); the change itself is always base tree → patch tree.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import blake3

from snapver.config import DEFAULT_EXCLUDE, DEFAULT_PATHS, Config
from snapver.errors import ConflictError, PatchError, RefError, StoreError, UsageError
from snapver.model import FILE, LINK, MAX_NAME_LENGTH, ZERO_OID, Entry, Manifest, compare_manifests, is_safe_relpath
from snapver.ops.broken import BrokenFile, broken_files
from snapver.ops.live import list_live
from snapver.ops.pristine import recorded, shipped
from snapver.refs import resolve_snapshot
from snapver.store import refs
from snapver.store.git import git_timeout
from snapver.store.objects import blob_oid
from snapver.store.pack import current_umask
from snapver.store.records import format_message
from snapver.store.repo import BIG_BLOB, Store
from snapver.store.team import TeamView, writer_of
from snapver.transport.agent.listing import exclusion
from snapver.unidiff import FileDiff, apply_delta, apply_hunks, check_delta_base, parse_diff

CHECKOUTS = ".snapver-patches"
EMPTY_TREE = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"  # git's id of the empty tree
MARKER = ".snapver-checkout"


@dataclass(frozen=True)
class PatchFile:
    """One path a patch touches: its entry in the base and in the patch (None: absent)."""

    path: str
    status: str
    base: Entry | None
    patch: Entry | None

    @property
    def mode_changed(self) -> bool:
        """True when the patch changes a file's permission bits (then a push sets them)."""
        return (self.base is not None and self.patch is not None and self.base.kind == self.patch.kind == FILE
                and stat.S_IMODE(self.base.mode) != stat.S_IMODE(self.patch.mode))


@dataclass
class Patch:
    """A patch as the store holds it (its tip commit and what it changes)."""

    name: str
    commit: str
    base: str
    base_node: str
    nodes: tuple[str, ...]
    message: str
    time: datetime
    paths: tuple[str, ...]
    meta: dict[str, Any]
    files: list[PatchFile] = field(default_factory=list)
    broken: list[BrokenFile] = field(default_factory=list)  # set by the verbs that warn (save, import, rebase)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "commit": self.commit, "base": self.base, "base_node": self.base_node,
                "nodes": list(self.nodes), "message": self.message, "time": self.time.isoformat(),
                "paths": list(self.paths),
                "files": [{"path": f.path, "status": f.status} for f in self.files],
                "broken": [b.to_json() for b in self.broken]}


def changed_files(base: Manifest, patched: Manifest) -> list[PatchFile]:
    """Every path whose kind, content or permission bits differ, sorted by path bytes."""
    return [PatchFile(c.path, c.status, c.old, c.new) for c in compare_manifests(base, patched)]


def entry_for(path: str, kind: str, mode: int, data: bytes) -> Entry:
    """The manifest entry of new content."""
    return Entry(path, kind, mode, len(data), blake3.blake3(data).hexdigest(), blob_oid(data))


# -- reading ---------------------------------------------------------------------------
def patch_names(store: Store) -> list[str]:
    """Every patch name of the team (any writer's)."""
    return sorted(TeamView(store).merged(refs.PATCHES))


def patch_tip(store: Store, name: str) -> str | None:
    """The current version of patch ``name`` across writers (``TeamView.patch_tip``), or None."""
    return TeamView(store).merged(refs.PATCHES).get(name) if refs.valid_ref_name(name) else None


def unseen_versions(store: Store, name: str) -> dict[str, str]:
    """``{writer: commit}`` of the versions of a patch that its current version does not
    contain (two writers edited it apart): a push refuses until one version has seen them all."""
    view = TeamView(store)
    versions = view.by_writer(refs.PATCHES).get(name, {})
    return view.patch_tip(versions)[1] if versions else {}


def load_patch(store: Store, name: str, with_files: bool = True) -> Patch:
    """The patch called ``name``; an unknown name is a RefError listing the known ones."""
    tip = patch_tip(store, name)
    if tip is None:
        known = patch_names(store)
        raise RefError(f"unknown patch {name!r}", hint=f"known patches: {', '.join(known) or '(none)'}")
    commit = store.commit(tip)
    meta = commit.meta
    if meta.get("kind") != "patch" or not meta.get("base"):
        raise StoreError(f"patch {name!r}: commit {tip[:10]} has no patch metadata")
    patch = Patch(name=name, commit=tip, base=meta["base"], base_node=meta.get("base_node", "?"),
                  nodes=tuple(meta.get("nodes", [])), message=meta.get("message", ""),
                  time=commit.time.astimezone(), paths=tuple(meta.get("paths") or DEFAULT_PATHS), meta=meta)
    if with_files:
        patch.files = _with_kept(changed_files(store.manifest(patch.base), store.manifest(tip)),
                                 store.manifest(tip), meta.get("keeps") or [])
    return patch


def _with_kept(files: list[PatchFile], tree: Manifest, keeps: list[str]) -> list[PatchFile]:
    """``files`` plus the files a rebase kept as added although the new base holds them
    too, only left behind there (see ``rebase_patch``): a push adds them where absent."""
    listed = {f.path for f in files}
    kept = [PatchFile(path, "A", None, tree.entries[path]) for path in keeps
            if path not in listed and path in tree.entries]
    return sorted(files + kept, key=lambda f: os.fsencode(f.path)) if kept else files


def with_warnings(store: Store, patch: Patch) -> Patch:
    """``patch`` with ``broken`` set: its files holding new conflict markers or Python that
    does not compile here (what a push would refuse)."""
    patch.broken = broken_files(patch.files, store.read_blob, store=store)
    return patch


def list_patches(store: Store) -> list[Patch]:
    """Every patch, by name (file lists read from the metadata count, not the trees)."""
    return [load_patch(store, name, with_files=False) for name in patch_names(store)]


def history(store: Store, name: str) -> list[Any]:
    """The patch's own commits, newest first (saves and rebases, down to its base), of every
    writer's version (``meta["writer"]`` says whose)."""
    patch = load_patch(store, name, with_files=False)
    versions = TeamView(store).tips(refs.PATCHES, name) or [patch.commit]
    commits = store.commits([*versions, f"^{patch.base}"])
    return [c for c in commits if c.meta.get("kind") == "patch" and c.meta.get("name") == name]


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


# -- writing ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Base:
    """A resolved base: commit id, its manifest and where it came from."""

    commit: str
    manifest: Manifest
    node: str
    paths: tuple[str, ...]
    dists: list[Any]


def resolve_base(store: Store, config: Config, ref: str) -> Base:
    commit = resolve_snapshot(store, config, ref)
    meta = store.commit(commit).meta
    node = meta.get("node") or meta.get("base_node") or "?"
    return Base(commit, store.manifest(commit), node, tuple(meta.get("paths") or DEFAULT_PATHS),
                meta.get("dists", []))


def check_new_name(store: Store, config: Config, name: str) -> None:
    """A patch name is one ref component, unused, and neither a node's name nor a tag's
    (refs would clash: `show NAME` could no longer say which is meant)."""
    refs.check_name("patch", name)
    if name in config.nodes or name in store.refs(refs.NODES):
        raise UsageError(f"a patch cannot be named like the node {name!r}")
    if name in TeamView(store).merged(refs.TAGS):
        raise UsageError(f"a patch cannot be named like the tag {name!r}",
                         hint="pick another name (a ref naming both would be ambiguous)")
    if patch_tip(store, name):
        raise UsageError(f"patch {name!r} already exists",
                         hint=f"pick another name, or `snapver patch delete {name}` first")


def check_targets(config: Config, nodes: Iterable[str]) -> tuple[str, ...]:
    """Target names as given (nodes or groups, ``NODE@live`` as the node), each known to the config."""
    from snapver.noderange import split_top

    names = tuple(config.live_name(n) for item in nodes for n in split_top(item) if n)  # ct[1,2]: one range
    if names:
        config.select(list(names))
    return names


def _write_patch_commit(store: Store, name: str, parent: str, manifest: Manifest, blobs: Iterable[bytes],
                        meta: dict[str, Any], old_tip: str | None) -> str:
    """Commit a patch tree and move the patch ref (compare-and-swap against ``old_tip``).

    Every version stays reachable: when ``parent`` is not the old tip (a rebase: the new
    base), the old tip is the commit's second parent. The commit is made on a scratch
    ref and the patch ref moved after (the store moves a ref only forward).
    """
    scratch = f"refs/snapver/scratch/{name}-{os.getpid()}"
    now = datetime.now(timezone.utc)
    meta = {**meta, "v": 1, "kind": "patch", "name": name, "time": now.isoformat(timespec="seconds"),
            "writer": writer_of(store)}
    subject = f"patch {name}: {meta.get('files', 0)} files on {meta.get('base_node', '?')} {meta['base'][:10]}"
    with store.lock():
        view = TeamView(store)
        current = view.merged(refs.PATCHES).get(name)
        if current != old_tip:
            raise ConflictError(f"patch {name!r} changed while this command ran", hint="run it again")
        own = store.ref(refs.patch_ref(name))
        with store.importer() as importer:
            for data in blobs:
                importer.add_blob(data)
            previous: tuple[str, ...] = (old_tip,) if old_tip is not None and old_tip != parent else ()
            # Versions of other writers (and our own) that this one has not got yet become its
            # parents too: a new version has seen every version synced here (store/team.py).
            seen = {parent, *previous}
            versions = {v for v in (own, *view.by_writer(refs.PATCHES).get(name, {}).values()) if v is not None}
            previous += tuple(commit for commit in sorted(versions)
                              if commit not in seen
                              and not any(view.contains(known, commit) for known in seen if known))
            mark = importer.commit(scratch, parent, manifest, format_message(subject, meta, meta.get("message", "")),
                                   now, also_parents=previous)
        commit = importer.results[mark]
        try:
            store.update_ref(refs.patch_ref(name), commit, own or ZERO_OID)
        finally:
            store.delete_ref(scratch)
    return commit


def _patch_meta(base: Base, nodes: tuple[str, ...], message: str, source: str, files: int) -> dict[str, Any]:
    return {"base": base.commit, "base_node": base.node, "nodes": list(nodes), "message": message,
            "source": source, "paths": list(base.paths), "dists": base.dists, "files": files}


def _build(base: Manifest, changes: dict[str, tuple[Entry | None, bytes | None]]) -> tuple[Manifest, list[bytes]]:
    """The base manifest with ``changes`` (path → new entry and content, or None: delete)."""
    entries = dict(base.entries)
    blobs = []
    for path, (entry, data) in changes.items():
        if entry is None:
            entries.pop(path, None)
        else:
            entries[path] = entry
            if data is not None:
                blobs.append(data)
    return Manifest(entries), blobs


# -- patch import ----------------------------------------------------------------------
def _within(path: str, tracked: Iterable[str]) -> bool:
    return any(path.startswith(root.strip("/") + "/") for root in tracked)


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
                if not _within(new, base.paths):
                    problems.append(f"{new}: outside the tracked paths ({', '.join(base.paths)})")
            elif diff.deleted or diff.rename or diff.copy:
                if old not in base.manifest:
                    problems.append(f"{old}: not in the base")
                if new is not None and not _within(new, base.paths):
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
    manifest, blobs = _build(base.manifest, changes)
    meta = _patch_meta(base, targets, message or subject, "import", len(changes))
    _write_patch_commit(store, name, base.commit, manifest, blobs, meta, None)
    return with_warnings(store, load_patch(store, name))


# -- patch capture ---------------------------------------------------------------------
def capture_patch(store: Store, config: Config, name: str, node: str, base_ref: str,
                  nodes: Iterable[str] = (), message: str = "") -> Patch | None:
    """Turn a node's live drift from the base into a patch; None when there is none."""
    from snapver.transport.connect import open_transport

    check_new_name(store, config, name)
    spec = config.node(node)
    targets = check_targets(config, nodes) or (spec.name,)
    base = resolve_base(store, config, base_ref)
    with open_transport(spec) as transport:
        listing = list_live(store, transport)
        live = listing.by_path()
        changed = [e for e in listing.entries if not _same(base.manifest.get(e.path), e.kind, e.oid, e.mode)]
        changes: dict[str, tuple[Entry | None, bytes | None]] = {
            e.path: (None, None) for e in base.manifest if e.path not in live and _within(e.path, spec.paths)}
        by_path = {e.path: e for e in changed}
        for path, kind, data in transport.read_files(list(by_path)):
            if kind is None:
                if path in base.manifest:
                    changes[path] = (None, None)
                continue
            entry = entry_for(path, kind, by_path[path].mode, data)
            if not _same(base.manifest.get(path), entry.kind, entry.oid, entry.mode):
                changes[path] = (entry, data)
    if not changes:
        return None
    manifest, blobs = _build(base.manifest, changes)
    meta = _patch_meta(base, targets, message or f"captured from {spec.name}", "capture", len(changes))
    meta["captured_from"] = spec.name
    _write_patch_commit(store, name, base.commit, manifest, blobs, meta, None)
    return load_patch(store, name)


def _same(entry: Entry | None, kind: str, oid: str, mode: int) -> bool:
    if entry is None or entry.kind != kind or entry.oid != oid:
        return False
    return kind != FILE or stat.S_IMODE(entry.mode) == stat.S_IMODE(mode)


# -- patch new / save: the editable checkout -------------------------------------------
def checkout_folder(store: Store, name: str) -> Path:
    """Where a patch's editable checkout lives: beside the store, one folder per patch."""
    if len(name) > MAX_NAME_LENGTH:
        refs.check_name("patch", name)  # no patch has such a name: say so before the file system does
    return store.path.parent / CHECKOUTS / name


@dataclass
class Checkout:
    patch: Patch
    folder: Path
    files: int


def _read_marker(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{folder} is not a patch checkout ({MARKER} is missing or unreadable)",
                         hint="make one with `snapver patch new NAME --base REF`") from exc


def _write_checkout(store: Store, folder: Path, manifest: Manifest, marker: dict[str, Any],
                    overrides: dict[str, bytes] | None = None) -> int:
    """Write a tree into a fresh folder (links as links) plus its marker.

    File modes are the recorded ones less the user's umask and any setuid/setgid/sticky
    bit (a checkout is the user's working copy); ``scan_checkout`` reads them back.
    Nothing is ever written through a symlink, whatever the manifest says.
    """
    overrides = overrides or {}
    folder.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(os.fsencode(folder))
    umask = current_umask()
    marker = {**marker, "umask": umask}
    by_oid: dict[str, list[Entry]] = {}
    for entry in manifest:
        if entry.path not in overrides:
            by_oid.setdefault(entry.oid, []).append(entry)

    def put(entry: Entry, data: bytes | Iterable[bytes]) -> None:
        target = os.path.join(os.fsencode(folder), os.fsencode(entry.path))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not is_safe_relpath(entry.path) or not os.path.realpath(os.path.dirname(target)).startswith(root + b"/"):
            raise StoreError(f"{entry.path!r} would be written outside {folder} (through a symlink); refused",
                             hint="run `snapver fsck`")
        if entry.kind == LINK:
            os.symlink(data if isinstance(data, bytes) else b"".join(data), target)
        else:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                for piece in [data] if isinstance(data, bytes) else data:
                    handle.write(piece)
            os.chmod(target, stat.S_IMODE(entry.mode) & 0o777 & ~umask)

    # A big file is copied from the store in pieces, never held whole.
    big = {oid for oid, entries in by_oid.items() if all(e.kind == FILE and e.size > BIG_BLOB for e in entries)}
    for oid, data in store.read_blobs(oid for oid in by_oid if oid not in big):
        for entry in by_oid[oid]:
            put(entry, data)
    for oid in sorted(big):
        for entry in by_oid[oid]:
            put(entry, store.blob_chunks(oid))
    for path, data in overrides.items():
        put(manifest.entries[path], data)
    (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return len(manifest)


def new_patch(store: Store, config: Config, name: str, base_ref: str | None,
              nodes: Iterable[str] = (), message: str = "", from_folder: str | None = None,
              root: str | None = None) -> Checkout:
    """Start a patch: record it (no change yet) and check its base out for editing.

    For an existing patch without ``base_ref``, check out its current tree instead.
    ``from_folder``: a folder (matched as a folder ref is, ``root`` as ``--root``) whose
    tree the patch makes of the base: every file that differs, is new or is missing there.
    """
    # The name first: a folder named after a name no store would keep cannot be looked at.
    if base_ref is None:
        patch = load_patch(store, name, with_files=False)
    else:
        check_new_name(store, config, name)
    folder = checkout_folder(store, name)
    if folder.exists() and any(folder.iterdir()):
        raise UsageError(f"{folder} already exists", hint=f"edit it and `snapver patch save {name}`, "
                         "or remove the folder to check the patch out again")
    if from_folder is not None and base_ref is None:
        raise UsageError("--from needs --base: the snapshot the folder's changes apply to")
    if base_ref is None:
        manifest = store.manifest(patch.commit)
    else:
        targets = check_targets(config, nodes)
        base = resolve_base(store, config, base_ref)
        manifest, source = base.manifest, "new"
        blobs: list[bytes] = []
        if from_folder is not None:
            manifest, blobs = _folder_tree(store, config, base, from_folder, root)
            source = "folder"
        meta = _patch_meta(base, targets, message, source, len(changed_files(base.manifest, manifest)))
        if from_folder is not None:
            meta["from"] = from_folder
        _write_patch_commit(store, name, base.commit, manifest, blobs, meta, None)
        patch = load_patch(store, name, with_files=False)
    marker = {"name": name, "store": str(store.path), "head": patch.commit, "parent": patch.commit,
              "base": patch.base, "paths": list(patch.paths)}
    files = _write_checkout(store, folder, manifest, marker)
    return Checkout(load_patch(store, name), folder, files)


def _folder_tree(store: Store, config: Config, base: Base, text: str,
                 root: str | None) -> tuple[Manifest, list[bytes]]:
    """The base's tracked paths as a folder holds them (read by the local agent, links as
    links), and the content of the files that differ from the base."""
    from snapver.folders import resolve_folder
    from snapver.transport.local import FolderTransport

    tree = resolve_folder(text, config, store, root, base.paths)
    entries: dict[str, Entry] = {}
    blobs: list[bytes] = []
    with FolderTransport(tree.spec(), tree.roots) as transport:
        listing = transport.list_tree()
        changed = {e.path: e for e in listing.entries if not _same(base.manifest.get(e.path), e.kind, e.oid, e.mode)}
        for entry in listing.entries:
            if entry.path not in changed:
                entries[entry.path] = base.manifest.entries[entry.path]
        for path, kind, data in transport.read_files(list(changed)):
            if kind is None:
                raise UsageError(f"{path} vanished from {text} while it was read; run the command again")
            entries[path] = entry_for(path, kind, changed[path].mode, data)
            blobs.append(data)
    # Base files outside the tracked paths the folder stands for are kept as they are.
    for path, kept in base.manifest.entries.items():
        if not _within(path, tree.tracked):
            entries.setdefault(path, kept)
    return Manifest(entries), blobs


def recorded_mode(st_mode: int, known: Entry | None, umask: int) -> int:
    """The mode to record for a checkout file: the bits the checkout's umask (and
    ``_write_checkout``) took away are the known entry's, the rest are the file's."""
    if known is None or known.kind != FILE or not umask:
        return st_mode
    hidden = umask | 0o7000
    return stat.S_IFMT(st_mode) | (stat.S_IMODE(st_mode) & ~hidden) | (stat.S_IMODE(known.mode) & hidden)


def scan_checkout(folder: Path, paths: Iterable[str], known: Manifest,
                  exclude: Iterable[str] = DEFAULT_EXCLUDE, umask: int = 0) -> tuple[Manifest, dict[str, bytes]]:
    """The tree in a checkout folder (links as links, excluded names skipped); content is
    returned only for blobs ``known`` does not hold. ``umask``: the one it was made with."""
    excluded = exclusion(list(exclude))  # the node's own rules
    entries: dict[str, Entry] = {}
    new_content: dict[str, bytes] = {}
    known_by_path = known.entries
    root = os.fsencode(folder)
    for tracked in paths:
        stack = [os.fsencode(tracked.strip("/"))]
        while stack:
            rel = stack.pop()
            try:
                scan = os.scandir(os.path.join(root, rel))
            except FileNotFoundError:
                continue
            with scan as items:
                for item in items:
                    child = os.path.join(rel, item.name)
                    path = os.fsdecode(child)
                    st = item.stat(follow_symlinks=False)
                    if excluded(os.fsdecode(item.name), path, stat.S_ISDIR(st.st_mode)):
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(child)
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        kind, data = LINK, os.readlink(os.path.join(root, child))
                    elif stat.S_ISREG(st.st_mode):
                        kind = FILE
                        with open(os.path.join(root, child), "rb") as handle:
                            data = handle.read()
                    else:
                        continue
                    oid = blob_oid(data)
                    old = known_by_path.get(path)
                    mode = recorded_mode(st.st_mode, old, umask)
                    if old is not None and old.oid == oid and old.kind == kind:
                        entries[path] = Entry(path, kind, mode, old.size, old.digest, oid)
                    else:
                        entries[path] = entry_for(path, kind, mode, data)
                        new_content[path] = data
    return Manifest(entries), new_content


@dataclass
class SaveResult:
    patch: Patch
    saved: bool
    changed: list[PatchFile]  # against the previous patch commit


def save_patch(store: Store, config: Config, name: str, message: str = "") -> SaveResult:
    """Record the checkout's edits as a new commit of the patch (nothing to save: none)."""
    folder = checkout_folder(store, name)
    if not folder.is_dir():
        load_patch(store, name, with_files=False)
        raise UsageError(f"patch {name!r} has no checkout at {folder}",
                         hint=f"make one with `snapver patch new {name}`")
    marker = _read_marker(folder)
    tip = patch_tip(store, name)
    if tip != marker.get("head"):
        raise ConflictError(f"patch {name!r} moved since {folder} was checked out "
                            f"({str(marker.get('head'))[:10]} → {str(tip)[:10]})",
                            hint="move the folder aside and check the patch out again with "
                            f"`snapver patch new {name}`")
    previous = load_patch(store, name, with_files=False)
    parent = marker["parent"]  # the patch's tip, or the new base of a rebase being finished
    base_id = marker["base"]
    base_meta = store.commit(base_id).meta
    known = store.manifest(parent)
    scanned, new_content = scan_checkout(folder, marker.get("paths") or previous.paths, known,
                                         _excludes(config, previous), marker.get("umask", 0))
    changed = changed_files(known, scanned)
    rebasing = parent != tip
    if not changed and not rebasing and not message:
        return SaveResult(previous, False, [])
    base_manifest = store.manifest(base_id)
    files = len(changed_files(base_manifest, scanned))
    meta = {**previous.meta, "base": base_id, "base_node": base_meta.get("node") or previous.base_node,
            "source": "rebase" if rebasing else "save", "files": files,
            "message": message or previous.message}
    meta.pop("rebased_from", None)
    if rebasing:
        meta["rebased_from"] = tip
        meta["keeps"] = marker.get("keeps") or []
    commit = _write_patch_commit(store, name, parent, scanned, new_content.values(), meta, tip)
    marker.update({"head": commit, "parent": commit, "base": base_id})
    (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return SaveResult(with_warnings(store, load_patch(store, name)), True, changed)


def _excludes(config: Config, patch: Patch) -> tuple[str, ...]:
    spec = config.nodes.get(patch.base_node)
    return spec.exclude if spec is not None else DEFAULT_EXCLUDE


def delete_patch(store: Store, name: str) -> Patch:
    """Delete a patch's name; its history moves to ``refs.deleted_patch_ref`` (push records
    may name any of its versions, so they stay in the store)."""
    patch = load_patch(store, name, with_files=False)
    own = store.ref(refs.patch_ref(name))
    if own is None:
        writers = ", ".join(sorted(TeamView(store).by_writer(refs.PATCHES).get(name, {})))
        raise UsageError(f"patch {name!r} is not this store's: {writers} wrote it",
                         hint="a writer deletes its own version of a patch")
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S") + f"-{own[:10]}"
    with store.lock():
        moves = (f"start\ncreate {refs.deleted_patch_ref(name, stamp)} {own}\n"
                 f"delete {refs.patch_ref(name)} {own}\ncommit\n")
        store.git("update-ref", "--stdin", input=moves.encode())
    return patch


# -- patch rebase ----------------------------------------------------------------------
@dataclass(frozen=True)
class RebasedFile:
    path: str
    # "clean", "merged", "dropped" (already in the new base), "kept" (there only as a leftover), "conflict"
    outcome: str
    detail: str = ""


@dataclass
class RebaseResult:
    patch: Patch
    onto: str
    files: list[RebasedFile]
    rebased: bool
    checkout: Path | None = None  # where the conflicts wait to be resolved

    @property
    def conflicts(self) -> list[RebasedFile]:
        return [f for f in self.files if f.outcome == "conflict"]


def _merge3(ours: bytes, base: bytes, theirs: bytes, labels: tuple[str, str, str]) -> tuple[bytes, int]:
    """Three-way merge of one file with `git merge-file`: (result, number of conflicts)."""
    with tempfile.TemporaryDirectory(prefix="snapver-merge-") as tmp:
        names = []
        for label, data in zip(("ours", "base", "theirs"), (ours, base, theirs), strict=False):
            path = os.path.join(tmp, label)
            with open(path, "wb") as handle:
                handle.write(data)
            names.append(path)
        try:
            result = subprocess.run(["git", "merge-file", "-p", "-L", labels[0], "-L", labels[1], "-L", labels[2],
                                     *names], capture_output=True, timeout=git_timeout(), start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise PatchError(f"git merge-file did not finish within {exc.timeout:g} s") from exc
    if result.returncode < 0 or result.returncode > 127:
        raise PatchError(f"git merge-file failed: {result.stderr.decode('utf-8', 'replace').strip()}")
    return result.stdout, result.returncode


def rebase_patch(store: Store, config: Config, name: str, onto_ref: str) -> RebaseResult:
    """Carry a patch onto a new base, three-way per file.

    Clean: a new patch commit on the new base. Conflicts: nothing is recorded; the
    merged tree, conflict markers included, is checked out for editing and
    `patch save` finishes the rebase. A conflict markers cannot show (modify/delete,
    binary, symlink) is checked out as the patch has it, so a save never drops the
    patch's side of it unseen.
    """
    patch = load_patch(store, name)
    onto = resolve_base(store, config, onto_ref)
    if onto.commit == patch.base:
        return RebaseResult(patch, onto.commit, [], False)
    labels = (name, f"base {patch.base[:10]}", f"onto {onto.commit[:10]}")
    shipped_rows = recorded(store, onto.commit)
    keeps: list[str] = []
    results: list[RebasedFile] = []
    changes: dict[str, tuple[Entry | None, bytes | None]] = {}
    overrides: dict[str, bytes] = {}
    for item in patch.files:
        new_base = onto.manifest.get(item.path)
        old, mine = item.base, item.patch
        if _entry_key(new_base) == _entry_key(mine) and old is None and mine is not None and mine.kind == FILE \
                and not shipped(shipped_rows, mine, store.read_blob(mine.oid)):
            # The new base has the added file, but not as a file of its release (pip leaves
            # what RECORD does not list): keep adding it, or a fresh node never gets it.
            keeps.append(item.path)
            results.append(RebasedFile(item.path, "kept", "in the new base only as a leftover"
                                       if shipped_rows is not None else
                                       "in the new base, which has no RECORD saying it ships it"))
        elif _entry_key(new_base) == _entry_key(mine):
            results.append(RebasedFile(item.path, "dropped", "the new base already has it"))
        elif _entry_key(new_base) == _entry_key(old):
            results.append(RebasedFile(item.path, "clean"))
            changes[item.path] = (mine, None)
        elif old is None or mine is None or new_base is None or FILE != old.kind or mine.kind != FILE \
                or new_base.kind != FILE:
            what = ("added by the patch and by the new base" if old is None else
                    "deleted by the patch, changed in the new base" if mine is None else
                    "changed by the patch, deleted in the new base" if new_base is None else "not a plain file")
            if mine is not None and new_base is not None and mine.kind == FILE == new_base.kind:
                merged, _ = _merge3(store.read_blob(mine.oid), b"", store.read_blob(new_base.oid), labels)
                overrides[item.path] = merged
                changes[item.path] = (entry_for(item.path, FILE, mine.mode, merged), merged)
            else:
                # No markers can hold both sides: the checkout holds the patch's (its file, or
                # none where it deletes), so a save leaves the patch's change in unless edited.
                changes[item.path] = (mine, None)
                what += (f"; left deleted in the checkout (the new base's: `snapver show {onto.commit[:10]} "
                         f"{item.path}`)" if mine is None else "; the patch's version is checked out")
            results.append(RebasedFile(item.path, "conflict", what))
        else:
            datas = [store.read_blob(e.oid) for e in (mine, old, new_base)]
            if any(b"\0" in d for d in datas):
                results.append(RebasedFile(item.path, "conflict", "binary content changed on both sides; "
                                           "the patch's version is checked out"))
                changes[item.path] = (mine, None)  # the patch's side, as above
                continue
            merged, conflicts = _merge3(datas[0], datas[1], datas[2], labels)
            mode = mine.mode if stat.S_IMODE(mine.mode) != stat.S_IMODE(old.mode) else new_base.mode
            entry = entry_for(item.path, FILE, mode, merged)
            changes[item.path] = (entry, merged)
            if conflicts:
                results.append(RebasedFile(item.path, "conflict", f"{conflicts} conflicting hunk(s)"))
                overrides[item.path] = merged
            else:
                results.append(RebasedFile(item.path, "merged"))
    manifest, blobs = _build(onto.manifest, changes)
    if any(r.outcome == "conflict" for r in results):
        folder = checkout_folder(store, name)
        if folder.exists():
            _require_clean_checkout(store, config, patch, folder)
            shutil.rmtree(folder)
        marker = {"name": name, "store": str(store.path), "head": patch.commit, "parent": onto.commit,
                  "base": onto.commit, "paths": list(onto.paths), "rebasing": True, "keeps": keeps}
        full = {p: d for p, (e, d) in changes.items() if e is not None and d is not None}
        _write_checkout(store, folder, manifest, marker, {**full, **overrides})
        return RebaseResult(patch, onto.commit, results, False, folder)
    files = len(changed_files(onto.manifest, manifest))
    meta = {**patch.meta, **_patch_meta(onto, patch.nodes, patch.message, "rebase", files + len(keeps)),
            "rebased_from": patch.commit, "keeps": keeps}
    _write_patch_commit(store, name, onto.commit, manifest, blobs, meta, patch.commit)
    return RebaseResult(with_warnings(store, load_patch(store, name)), onto.commit, results, True)


def _entry_key(entry: Entry | None) -> tuple[str, str, int] | None:
    if entry is None:
        return None
    return entry.kind, entry.oid, stat.S_IMODE(entry.mode) if entry.kind == FILE else 0


def unsaved_edits(store: Store, config: Config, patch: Patch) -> list[str]:
    """The files edited in the patch's checkout (``patch new``) that ``patch save`` has not
    recorded; none without a checkout (or with one that is not readable as such)."""
    folder = checkout_folder(store, patch.name)
    if not folder.is_dir():
        return []
    try:
        marker = _read_marker(folder)
        known = store.manifest(marker["parent"])
    except (UsageError, KeyError):
        return []
    scanned, _ = scan_checkout(folder, marker.get("paths") or patch.paths, known, _excludes(config, patch),
                               marker.get("umask", 0))
    return [item.path for item in changed_files(known, scanned)]


def _require_clean_checkout(store: Store, config: Config, patch: Patch, folder: Path) -> None:
    marker = _read_marker(folder)
    known = store.manifest(marker["parent"])
    scanned, _ = scan_checkout(folder, marker.get("paths") or patch.paths, known, _excludes(config, patch),
                               marker.get("umask", 0))
    if marker.get("head") != patch.commit or changed_files(known, scanned):
        raise UsageError(f"{folder} holds unsaved edits of patch {patch.name!r}",
                         hint=f"save them (`snapver patch save {patch.name}`) or remove the folder, then rebase")
