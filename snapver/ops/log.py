"""Log and show: read snapshots back from the store."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from snapver.config import Config
from snapver.errors import RefError, UsageError
from snapver.model import MANIFEST_PATH, Manifest
from snapver.refs import resolve_snapshot
from snapver.store import refs
from snapver.store.repo import Commit, Store


@dataclass(frozen=True)
class SnapshotInfo:
    """One snapshot as `log` and `show` report it."""

    id: str
    time: datetime
    node: str
    files: int
    changed: int
    tags: tuple[str, ...]
    dists: tuple[str, ...]
    message: str
    meta: dict

    def to_json(self) -> dict:
        return {"id": self.id, "time": self.time.isoformat(), "node": self.node, "files": self.files,
                "changed": self.changed, "tags": list(self.tags), "dists": list(self.dists),
                "message": self.message, "meta": self.meta}


def tags_by_commit(store: Store) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, commit in store.refs(refs.TAGS).items():
        found.setdefault(commit, []).append(name)
    return found


def describe(commit: Commit, tags: dict[str, list[str]]) -> SnapshotInfo:
    meta = commit.meta
    return SnapshotInfo(
        id=commit.id, time=commit.time.astimezone(), node=meta.get("node", "?"),
        files=int(meta.get("files", 0)), changed=int(meta.get("changed", 0)),
        tags=tuple(sorted(tags.get(commit.id, []))),
        dists=tuple(f"{name} {version}" for name, version in meta.get("dists", [])),
        message=meta.get("message", ""), meta=meta)


def log(store: Store, config: Config, node: str | None = None, limit: int | None = None) -> list[SnapshotInfo]:
    """Snapshots newest first, of one node or of all."""
    heads = store.refs(refs.NODES)
    if node is not None:
        if node not in heads:
            if node in config.nodes:
                return []
            raise UsageError(f"unknown node {node!r}",
                             hint=f"known nodes: {', '.join(sorted(set(heads) | set(config.nodes)))}")
        revs = [refs.node_ref(node)]
    else:
        revs = [refs.node_ref(name) for name in sorted(heads)]
    # Imported snapshots older than their node's head are kept beside its branch.
    revs += [refs.IMPORTS + name for name in sorted(store.refs(refs.IMPORTS))
             if node is None or name.startswith(node + "/")]
    tags = tags_by_commit(store)
    return [describe(c, tags) for c in store.commits(revs, limit=limit)]


@dataclass(frozen=True)
class ShowResult:
    snapshot: SnapshotInfo
    manifest: Manifest | None = None
    path: str | None = None
    content: bytes | None = None


def show(store: Store, config: Config, ref: str, path: str | None = None) -> ShowResult:
    """A snapshot's metadata and manifest, or one file's content in it."""
    commit_id = resolve_snapshot(store, config, ref)
    info = describe(store.commit(commit_id), tags_by_commit(store))
    manifest = store.manifest(commit_id)
    if path is None:
        return ShowResult(info, manifest)
    path = path.strip("/")
    entry = manifest.get(path)
    if entry is None or path == MANIFEST_PATH:
        import difflib

        near = difflib.get_close_matches(path, list(manifest.entries), n=3, cutoff=0.8)
        raise RefError(f"{path!r} is not in snapshot {commit_id[:10]}",
                       hint=("did you mean: " + ", ".join(near)) if near else "paths are relative to site-packages")
    return ShowResult(info, None, path, store.read_blob(entry.oid))
