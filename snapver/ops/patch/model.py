"""Patch values and the patch record: loading, listing, naming, writing a version, deleting.

A patch is a commit on ``refs/heads/patches/<name>`` whose tree is the base tree with
the change applied (and ``.snapver/manifest`` updated); its first commit's parent is
the base snapshot, and every `patch save` adds a commit on top, so `git log` shows the
patch's history. The base, the default target nodes and the message live in the commit
metadata (kind "patch"); the change itself is always base tree → patch tree.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import blake3

from snapver.config import DEFAULT_PATHS, Config
from snapver.errors import ConflictError, RefError, StoreError, UsageError
from snapver.model import FILE, ZERO_OID, Entry, Manifest, compare_manifests
from snapver.ops.broken import BrokenFile, broken_files
from snapver.refs import resolve_snapshot
from snapver.store import refs
from snapver.store.objects import blob_oid
from snapver.store.records import format_message
from snapver.store.repo import Store
from snapver.store.team import TeamView, writer_of


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


def write_patch_commit(store: Store, name: str, parent: str, manifest: Manifest, blobs: Iterable[bytes],
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


def patch_meta(base: Base, nodes: tuple[str, ...], message: str, source: str, files: int) -> dict[str, Any]:
    return {"base": base.commit, "base_node": base.node, "nodes": list(nodes), "message": message,
            "source": source, "paths": list(base.paths), "dists": base.dists, "files": files}


def build_tree(base: Manifest, changes: dict[str, tuple[Entry | None, bytes | None]]) -> tuple[Manifest, list[bytes]]:
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


def within_tracked(path: str, tracked: Iterable[str]) -> bool:
    return any(path.startswith(root.strip("/") + "/") for root in tracked)


def same_entry(entry: Entry | None, kind: str, oid: str, mode: int) -> bool:
    if entry is None or entry.kind != kind or entry.oid != oid:
        return False
    return kind != FILE or stat.S_IMODE(entry.mode) == stat.S_IMODE(mode)


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
