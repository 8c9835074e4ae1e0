"""Log and show: read snapshots back from the store."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from snapver.config import Config
from snapver.environment import Environment
from snapver.errors import RefError, UsageError
from snapver.model import MANIFEST_PATH, SPECIAL, Entry, Manifest
from snapver.ops.diff import diff
from snapver.ops.envrecord import snapshot_environment
from snapver.refs import resolve_snapshot
from snapver.store import refs
from snapver.store.repo import Commit, Store
from snapver.store.team import TeamView


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
    event: str = "pull"  # what made it: pull | push | rollback | before-push | before-rollback | import | patch
    patch: str | None = None  # the patch a push wrote
    writer: str | None = None  # the store that took it (a team store's writer id; None before writer ids)

    @property
    def made_by(self) -> str:
        """``pull``, ``push NAME``, ``before-push NAME``, ``rollback``, ``before-rollback``, ``import``."""
        return (
            f"{self.event} {self.patch}"
            if self.patch and self.event in ("push", "before-push", "patch")
            else self.event
        )

    def to_json(self) -> dict:
        return {"id": self.id, "time": self.time.isoformat(), "node": self.node, "files": self.files,
                "changed": self.changed, "tags": list(self.tags), "dists": list(self.dists),
                "event": self.event, "patch": self.patch, "writer": self.writer, "message": self.message,
                "meta": self.meta}


def tags_by_commit(store: Store, view: TeamView | None = None) -> dict[str, list[str]]:
    """``{commit: [tag, ...]}`` of the team's tags (a tag whose writers disagree names none)."""
    found: dict[str, list[str]] = {}
    for name, commit in (view or TeamView(store)).merged(refs.TAGS).items():
        found.setdefault(commit, []).append(name)
    return found


def push_events(store: Store, view: TeamView | None = None) -> dict[str, tuple[str, str | None]]:
    """``{snapshot: (action, patch)}`` for the snapshots push records name as taken after
    their writes: what made the snapshots of stores written before snapshots said it."""
    view = view or TeamView(store)
    tips = sorted({commit for by in view.by_writer(refs.PUSHES).values() for commit in by.values()})
    found: dict[str, tuple[str, str | None]] = {}
    for record in store.commits(tips) if tips else []:
        after = record.meta.get("after")
        if isinstance(after, str) and after not in found:
            found[after] = (str(record.meta.get("action", "push")), record.meta.get("patch"))
    return found


def describe(commit: Commit, tags: dict[str, list[str]],
             pushed: dict[str, tuple[str, str | None]] | None = None) -> SnapshotInfo:
    """A commit as log and show report it; ``pushed``: see ``push_events``."""
    meta = commit.meta
    event, patch = meta.get("event"), meta.get("patch")
    if not isinstance(event, str):
        if meta.get("kind") == "patch":
            event, patch = "patch", meta.get("name")
        else:
            event, patch = (pushed or {}).get(commit.id, ("pull", None))
    return SnapshotInfo(
        id=commit.id, time=commit.time.astimezone(), node=meta.get("node", "?"),
        files=int(meta.get("files", 0)), changed=int(meta.get("changed", 0)),
        tags=tuple(sorted(tags.get(commit.id, []))),
        dists=tuple(f"{name} {version}" for name, version in meta.get("dists", [])),
        message=meta.get("message", ""), meta=meta, event=event,
        patch=patch if isinstance(patch, str) else None,
        writer=meta["writer"] if isinstance(meta.get("writer"), str) else None)


def parse_since(text: str) -> datetime:
    """The moment ``log --since`` starts at: a day (``2026-05-22``, ``may22``: its start,
    local time) or an ISO time. UsageError otherwise."""
    from datetime import time as day_start

    from snapver.refs import DATE_HINT, parse_day

    day = parse_day(text)
    if day is not None:
        return datetime.combine(day, day_start.min).astimezone()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UsageError(f"--since {text!r}: not a date", hint=DATE_HINT + ", or 2026-05-22T14:30") from None
    return moment if moment.tzinfo else moment.astimezone()


def log(store: Store, config: Config, node: str | None = None, limit: int | None = None,
        since: datetime | None = None) -> list[SnapshotInfo]:
    """Snapshots newest first, of one node, of a group's (or a node range's) nodes, or of
    all (``since``: only those taken then or later)."""
    from snapver.ops.diff_group import group_nodes, names_nodes

    view = TeamView(store)
    if node is not None and node not in config.nodes and names_nodes(config, node):
        return _of_nodes(store, view, set(group_nodes(config, node)), limit, since)
    heads = view.by_writer(refs.NODES)  # every writer's branch of each node (a team store)
    if node is not None and node not in heads:
        if node in config.nodes:
            return []
        raise UsageError(f"unknown node {node!r}",
                         hint=f"known nodes: {', '.join(sorted(set(heads) | set(config.nodes)))}")
    tags = tags_by_commit(store, view)
    pushed = push_events(store, view)
    commits = view.snapshots(node, limit=None if since is not None else limit)
    if since is not None:
        commits = [c for c in commits if c.time >= since][:limit]
    return [describe(c, tags, pushed) for c in commits]


def _of_nodes(store: Store, view: TeamView, nodes: set[str], limit: int | None,
              since: datetime | None) -> list[SnapshotInfo]:
    """The snapshots of several nodes, newest first, in the one order of every node's history."""
    commits = [c for c in view.snapshots(None) if c.meta.get("node") in nodes
               and (since is None or c.time >= since)][:limit]
    tags, pushed = tags_by_commit(store, view), push_events(store, view)
    return [describe(c, tags, pushed) for c in commits]


@dataclass(frozen=True)
class ShowResult:
    snapshot: SnapshotInfo
    manifest: Manifest | None = None
    path: str | None = None
    file: Entry | None = None  # the file ``path`` names: its content is read with ``content``
    parent: str | None = None
    changes: Any = None  # DiffResult from the parent (with diffstat numbers), None for a first snapshot
    environment: Environment | None = None  # what the snapshot recorded under its tree, if it did


def newest_snapshot(store: Store) -> str:
    """The newest snapshot of any node (what ``show`` with no ref shows, as ``git show``)."""
    newest = TeamView(store).snapshots(None, limit=1)
    if not newest:
        raise RefError("no snapshots yet", hint="snapver pull NODE")
    return newest[0].id


def show(store: Store, config: Config, ref: str | None, path: str | None = None) -> ShowResult:
    """A snapshot's metadata and manifest and the files changed from its parent, or one
    file's content in it (``path`` as after ``diff --``: a path, a file name or a glob).
    No ``ref``: the newest snapshot."""
    commit_id = newest_snapshot(store) if ref is None else resolve_snapshot(store, config, ref)
    commit = store.commit(commit_id)
    info = describe(commit, tags_by_commit(store), push_events(store))
    manifest = store.manifest(commit_id)
    if path is None:
        parent = commit.parents[0] if commit.parents else None
        if commit.meta.get("kind") == "patch" and isinstance(commit.meta.get("base"), str):
            parent = commit.meta["base"]  # a patch shows what it changes (its first parent may be its last version)
        changes = diff(store, config, parent, commit_id, contents=True) if parent else None
        return ShowResult(info, manifest, parent=parent, changes=changes,
                          environment=snapshot_environment(store, commit_id, commit.meta))
    path = _one_file(config, commit, manifest, path)
    entry = manifest.entries[path]
    if entry.kind == SPECIAL:  # the store keeps a line saying what it is, never content to print
        record = store.blob_head(entry.oid, 200).decode("ascii", "replace").strip()
        what = record.rpartition("special file: ")[2] or "special file"
        raise UsageError(f"{path!r} is a {what} in snapshot {commit_id[:10]}: a special file has no content to show",
                         hint=f"`snapver show {ref}` lists the snapshot's files")
    return ShowResult(info, None, path, entry)


def _one_file(config: Config, commit: Commit, manifest: Manifest, operand: str) -> str:
    """The file of a snapshot that ``operand`` names, in the grammar of ``diff -- PATH``."""
    from snapver.folders import tracked_paths
    from snapver.ops.trees import normalize_paths, one_path

    roots = list(dict.fromkeys([*tracked_paths(config), *(commit.meta.get("paths") or ())]))
    files = [path for path in manifest.entries if path != MANIFEST_PATH]
    return one_path(normalize_paths([operand])[0], files, roots, f"snapshot {commit.id[:10]}")


def content(store: Store, entry: Entry) -> Iterator[bytes]:
    """A file's content in pieces (a 500 MB ``.so`` is never held whole)."""
    return store.blob_chunks(entry.oid)
