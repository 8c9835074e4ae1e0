"""Push records and their queries: the ledger of pushes and rollbacks.

Each node has a branch ``refs/heads/pushes/<node>`` per writer; every push or rollback
appends a record there ("started", then its outcome), so a push killed at any moment is
visible and can be rolled back. In a team store the writer of a record is the namespace
it was read from.
"""

from __future__ import annotations

import heapq
import re
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from snapver.model import Manifest
from snapver.store import refs
from snapver.store.records import format_message, push_record_meta
from snapver.store.repo import Commit, Store
from snapver.store.team import TeamView, commit_moment, writer_of


@dataclass(frozen=True)
class PushState:
    """What the newest push record of a node says."""

    node: str
    record: str
    action: str
    state: str
    patch: str | None
    time: datetime
    before: str | None
    restore: str | None
    after: str | None
    running: bool = False
    waves: str | None = None  # "stopped after 1 of 2 wave(s) (1,100%)" for a push in waves that stopped
    writer: str | None = None  # who wrote the record, in a team store (None: this store alone)
    container: dict[str, Any] | None = None  # the container and image ids it wrote into (ops/layer.py)

    @property
    def interrupted(self) -> bool:
        """A push or rollback that began writing and never finished (not running now)."""
        return self.state == "started" and not self.running

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "record": self.record, "action": self.action, "state": self.state,
                "patch": self.patch, "time": self.time.isoformat(), "before": self.before,
                "restore": self.restore, "after": self.after, "running": self.running,
                "interrupted": self.interrupted, "waves": self.waves, "writer": self.writer,
                "container": self.container}


def _state_of(node: str, commit: Commit, running: bool = False, writer: str | None = None) -> PushState:
    meta = commit.meta
    return PushState(node, commit.id, meta.get("action", "push"), meta.get("state", "?"), meta.get("patch"),
                     commit.time.astimezone(), meta.get("before"), meta.get("restore") or meta.get("before"),
                     meta.get("after"), running, _waves_note(meta), writer,
                     meta["container"] if isinstance(meta.get("container"), dict) else None)


def _waves_note(meta: dict[str, Any]) -> str | None:
    """What a record of a push in waves says of where it stopped (None: not in waves, or
    its node's wave finished)."""
    if not meta.get("waves") or meta.get("state") == "done":
        return None
    return (f"the {meta.get('action', 'push')} stopped after {meta.get('waves_finished', 0)} of "
            f"{meta.get('of_waves', '?')} wave(s) ({meta['waves']})")


def _ledger(store: Store, node: str, per_writer: int | None = None,
            notes: list[str] | None = None) -> tuple[list[tuple[str, Commit]], TeamView]:
    """Every writer's push records of ``node``, newest first, each with its writer: the
    namespace it was read from, never a field of the record (a namespace is the one thing a
    writer cannot forge). A record in another writer's namespace claiming someone else
    wrote it is left out, and said in ``notes``. ``per_writer``: read at most that many of
    each writer's records."""
    view = TeamView(store)
    chains = []
    refused: list[tuple[str, Commit]] = []
    # Higher writer ids first: on equal times heapq.merge keeps the earlier list's first (as newest()).
    for writer, tip in sorted(view.by_writer(refs.PUSHES).get(node, {}).items(), reverse=True):
        chain = []
        # First parents only: a writer's ledger is one line of its own records; whatever a
        # record names as a further parent is no record of theirs.
        for commit in store.commits([tip], limit=per_writer, first_parent=True):
            claimed = commit.meta.get("writer")
            if writer != view.me and claimed is not None and claimed != writer:
                refused.append((writer, commit))
            else:
                chain.append((writer, commit))
        chains.append(chain)
    accepted = {commit.id for chain in chains for _, commit in chain}
    for writer, commit in refused:
        if notes is not None and commit.id not in accepted:  # a copy of a real record (its writer's) is no news
            notes.append(f"ignored push record {commit.id[:10]} of {node} published by {writer!r}: "
                         f"it claims to be {commit.meta.get('writer')!r}'s")
    return list(heapq.merge(*chains, key=lambda item: -commit_moment(item[1]))), view


def _shown_writer(view: TeamView, writer: str) -> str | None:
    return writer if view.is_team else None


def newest_record(store: Store, node: str, check_lock: bool = True) -> PushState | None:
    """The node's newest push record (of any writer); ``running`` if it is "started", ours
    and the store is locked."""
    ledger, view = _ledger(store, node, per_writer=1)
    if not ledger:
        return None
    writer, commit = ledger[0]
    # A shared-lock probe: the threads of one command (status of several nodes) never take
    # each other's probe for a running push.
    running = check_lock and writer == view.me and commit.meta.get("state") == "started" and store.is_locked()
    return _state_of(node, commit, running, _shown_writer(view, writer))


_COMMIT_ID = re.compile(r"[0-9a-f]{40}")


def in_node_history(view: TeamView, node: str, commit: str) -> bool:
    """True when ``commit`` is a snapshot of ``node``: in any writer's branch of it, or an
    import kept beside it (what `log NODE` lists)."""
    if not isinstance(commit, str) or not _COMMIT_ID.fullmatch(commit):
        return False  # a record's field, never handed to git as anything but an id
    heads = set(view.by_writer(refs.NODES).get(node, {}).values()) | set(view.under(refs.IMPORTS + node + "/").values())
    return any(view.contains(head, commit) for head in sorted(heads))


def last_push(store: Store, node: str, notes: list[str] | None = None) -> PushState | None:
    """The newest push that changed the node and was not undone (by its own failure
    handling), by any writer; its ``restore`` is the state before it. A record whose restore
    point is no snapshot of the node is passed over (said in ``notes``): undoing it would
    write a tree that node never had."""
    ledger, view = _ledger(store, node, notes=notes)
    seen: set[str] = set()
    for writer, commit in ledger:
        push_id = commit.meta.get("push_id", commit.id)
        if push_id in seen:
            continue
        seen.add(push_id)
        if commit.meta.get("action") == "push" and commit.meta.get("state") in ("done", "started", "failed"):
            pushed = _state_of(node, commit, writer=_shown_writer(view, writer))
            if not pushed.restore or in_node_history(view, node, pushed.restore):
                return pushed
            if notes is not None:
                notes.append(f"ignored push record {commit.id[:10]} of {node} published by {writer!r}: its "
                             f"restore point {str(pushed.restore)[:10]} is not a snapshot of {node}")
    return None


@dataclass
class Record:
    """What a push record says besides its node and state."""

    action: str  # "push" | "rollback"
    subject: str
    meta: dict[str, Any]
    push_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    per_node: dict[str, dict[str, Any]] = field(default_factory=dict)  # meta of one node's records only


def write_records(store: Store, record: Record, rows: list[dict[str, Any]]) -> dict[str, str]:
    """Append one record per row (``node``, ``state``, ``tree`` commit, ``container`` ids,
    extra meta) in one store write; returns ``{node: record commit}``."""
    now = datetime.now(timezone.utc)
    marks = {}
    writer = writer_of(store)  # the ledger says who (a team store's push records are everyone's)
    with store.importer() as importer:
        for row in rows:
            node = row["node"]
            meta = push_record_meta({**record.meta, **record.per_node.get(node, {}),
                                     **{k: v for k, v in row.items() if k not in ("tree", "container")}},
                                    writer=writer, action=record.action, push_id=record.push_id, when=now,
                                    container=row.get("container"))
            manifest = store.manifest(row["tree"]) if row.get("tree") else Manifest()
            subject = f"{record.subject} on {node}: {row['state']}"
            marks[node] = importer.commit(refs.push_ref(node), store.ref(refs.push_ref(node)), manifest,
                                          format_message(subject, meta), now)
    return {node: importer.results[mark] for node, mark in marks.items()}
