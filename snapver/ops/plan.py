"""The one plan/apply path that push and rollback share.

A plan is, per node, the list of paths to write or delete, each with the state the
node had when planned (kind and git blob id) and the entry it should end up with. The
node checks every expectation again before it writes anything (a node that changed
since the plan is refused untouched), writes each file atomically, removes stale
bytecode and re-hashes what it wrote; that re-hash is checked here.

Applying, under the store lock: snapshot each node (before), write a push record
("started") on ``refs/heads/pushes/<node>`` — so a push killed at any later moment is
visible and can be rolled back — then write the nodes in parallel, run the health
check, roll back failed nodes (and, unless ``keep_going``, the others), snapshot them
again (after) and mark each record with its final state.
"""

from __future__ import annotations

import os
import stat
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from snapver.config import NodeSpec
from snapver.errors import (ConflictError, RemotePathError, SnapverError, StoreError, StoreLockedError,
                             TransportError)
from snapver.model import FILE, LINK, Entry, Manifest
from snapver.store import refs
from snapver.store.repo import Commit, Store, format_message
from snapver.transport.base import Transport, open_transport

WRITE, DELETE, SKIP, CONFLICT = "write", "delete", "skip", "conflict"
CHUNK = 1 << 20
# Test hook (documented in tests/ops/test_push.py): after sending this many files to a
# node, stop and sleep, so a test can kill the push half-way.
PAUSE_ENV = "SNAPVER_TEST_PAUSE_AFTER_FILES"
MAX_PARALLEL = 16


@dataclass(frozen=True)
class Live:
    """A path as a node holds it now: kind ("f", "l" or "other"), git blob id, st_mode."""

    kind: str
    oid: str | None
    mode: int

    @classmethod
    def of(cls, state: list[Any] | None) -> "Live | None":
        return None if state is None else cls(state[0], state[1], state[2])

    def matches(self, entry: Entry | None, with_mode: bool) -> bool:
        if entry is None or self.kind != entry.kind or self.oid != entry.oid:
            return False
        return not with_mode or entry.kind != FILE or stat.S_IMODE(self.mode) == stat.S_IMODE(entry.mode)


@dataclass
class Step:
    """One path of a node's plan: what it is now, what it should become, and why."""

    path: str
    action: str
    live: Live | None
    target: Entry | None
    keep_mode: bool = False  # write the content but keep the file's permission bits
    note: str = ""
    forced: bool = False

    def wire(self) -> list[Any]:
        """[path, kind or None to delete, permission bits or None to keep, expected state]."""
        target = self.target if self.action == WRITE else None
        mode = None if target is None or self.keep_mode or target.kind == LINK else stat.S_IMODE(target.mode)
        expect = None if self.live is None else [self.live.kind, self.live.oid]
        return [self.path, target.kind if target else None, mode, expect]


@dataclass
class NodePlan:
    """One node's plan; holds the node's open transport until closed."""

    spec: NodeSpec
    steps: list[Step] = field(default_factory=list)
    error: SnapverError | None = None
    transport: Transport | None = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)

    @property
    def node(self) -> str:
        return self.spec.name

    @property
    def writes(self) -> list[Step]:
        return [s for s in self.steps if s.action in (WRITE, DELETE)]

    @property
    def conflicts(self) -> list[Step]:
        return [s for s in self.steps if s.action == CONFLICT]

    def close(self) -> None:
        if self.transport is not None:
            transport, self.transport = self.transport, None
            transport.close()

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "error": str(self.error) if self.error else None, "notes": self.notes,
                "files": [{"path": s.path, "action": s.action, "note": s.note, "forced": s.forced}
                          for s in self.steps]}


def within(path: str, tracked: Iterable[str]) -> bool:
    return any(path.startswith(root.strip("/") + "/") for root in tracked)


def open_node(spec: NodeSpec) -> Transport:
    transport = open_transport(spec)
    try:
        transport.open()
    except BaseException:
        transport.close()
        raise
    return transport


def check_paths(transport: Transport, spec: NodeSpec, paths: list[str]) -> dict[str, Live | None]:
    """The live state of ``paths``; a path through a symlink (or otherwise unsafe) refuses."""
    reply = transport.call("check", tracked=list(spec.paths), files=paths)
    if reply["unsafe"]:
        first = sorted(reply["unsafe"].values())[0]
        raise RemotePathError(f"{spec.name}: refused: {first}",
                              hint="snapver never writes through a symlink or outside the tracked paths")
    return {path: Live.of(state) for path, state in reply["states"].items()}


def restore_steps(live: dict[str, Live | None], target: dict[str, Entry | None]) -> list[Step]:
    """The steps that make ``live`` exactly ``target`` (content, kind, mode; absent = delete)."""
    steps = []
    for path in sorted(set(live) | set(target), key=os.fsencode):
        now, wanted = live.get(path), target.get(path)
        if wanted is None:
            if now is not None:
                steps.append(Step(path, DELETE, now, None, note="remove"))
        elif now is None:
            steps.append(Step(path, WRITE, None, wanted, note="restore (absent)"))
        elif not now.matches(wanted, with_mode=True):
            note = "restore mode" if now.matches(wanted, with_mode=False) else "restore"
            steps.append(Step(path, WRITE, now, wanted, note=note))
    return steps


@dataclass
class WriteResult:
    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytecode_removed: list[str] = field(default_factory=list)


def write_node(store: Store, transport: Transport, spec: NodeSpec, steps: list[Step]) -> WriteResult:
    """Write ``steps`` on one node and check the node's re-hash of every file it wrote."""
    todo = [s for s in steps if s.action in (WRITE, DELETE)]
    if not todo:
        return WriteResult()
    reply = transport.call("write", tracked=list(spec.paths), files=[s.wire() for s in todo])
    if reply.get("unsafe"):
        raise RemotePathError(f"{spec.name}: refused: {sorted(reply['unsafe'].values())[0]}",
                              hint="snapver never writes through a symlink or outside the tracked paths")
    if reply.get("conflicts"):
        changed = sorted(reply["conflicts"])
        raise ConflictError(f"{spec.name}: changed since the plan was made: {', '.join(changed[:5])}"
                            + (f" and {len(changed) - 5} more" if len(changed) > 5 else ""),
                            hint="nothing was written there; run the command again to see the new plan")
    oids = [s.target.oid for s in todo if s.action == WRITE and s.target is not None]
    content = dict(store.read_blobs(oids))
    pause = int(os.environ.get(PAUSE_ENV) or 0)
    sent = 0
    for step in todo:
        if step.action != WRITE or step.target is None:
            continue
        data = content[step.target.oid]
        transport.send_stream(data[i:i + CHUNK] for i in range(0, len(data), CHUNK))
        sent += 1
        if pause and sent == pause:
            time.sleep(3600)
    done = transport.call("write_done")
    if done.get("failure"):
        raise TransportError(f"{spec.name}: write failed: {done['failure']}")
    written = done.get("written", {})
    for step in todo:
        if step.action == WRITE and step.target is not None:
            got = Live.of(written.get(step.path))
            if got is None or not got.matches(step.target, with_mode=not step.keep_mode):
                raise TransportError(f"{spec.name}: {step.path}: re-hash after writing does not match "
                                     f"(wrote {step.target.oid[:10]}, found {got.oid[:10] if got and got.oid else got})")
        elif done.get("deleted", {}).get(step.path) is not None:
            raise TransportError(f"{spec.name}: {step.path}: still there after deleting it")
    return WriteResult(sorted(written), sorted(done.get("deleted", {})), done.get("bytecode_removed", []))


def run_health(transport: Transport, spec: NodeSpec, command: str, timeout: float) -> str:
    """Run the health check on the node; a failure (exit code, timeout) raises."""
    reply = transport.call("run", command=command, timeout=timeout)
    output = reply.get("output", "").strip()
    if reply.get("timed_out") or reply.get("code") != 0:
        why = f"timed out after {timeout:g} s" if reply.get("timed_out") else f"exit {reply.get('code')}"
        tail = output.splitlines()[-1] if output else "no output"
        raise TransportError(f"{spec.name}: health check failed ({why}): {tail}", hint=f"command: {command}")
    return output


# -- push records ------------------------------------------------------------------------
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

    @property
    def interrupted(self) -> bool:
        """A push or rollback that began writing and never finished (not running now)."""
        return self.state == "started" and not self.running

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "record": self.record, "action": self.action, "state": self.state,
                "patch": self.patch, "time": self.time.isoformat(), "before": self.before,
                "restore": self.restore, "after": self.after, "running": self.running,
                "interrupted": self.interrupted}


def _state_of(node: str, commit: Commit, running: bool = False) -> PushState:
    meta = commit.meta
    return PushState(node, commit.id, meta.get("action", "push"), meta.get("state", "?"), meta.get("patch"),
                     commit.time.astimezone(), meta.get("before"), meta.get("restore") or meta.get("before"),
                     meta.get("after"), running)


def newest_record(store: Store, node: str, check_lock: bool = True) -> PushState | None:
    """The node's newest push record; ``running`` if it is "started" and the store is locked."""
    tip = store.ref(refs.push_ref(node))
    if tip is None:
        return None
    commit = store.commit(tip)
    running = False
    if check_lock and commit.meta.get("state") == "started":
        try:
            with store.lock(wait=0):
                pass
        except StoreLockedError:
            running = True
    return _state_of(node, commit, running)


def last_push(store: Store, node: str) -> PushState | None:
    """The newest push that changed the node and was not undone (by its own failure
    handling); its ``restore`` is the state before it."""
    tip = store.ref(refs.push_ref(node))
    if tip is None:
        return None
    seen: set[str] = set()
    for commit in store.commits([tip]):
        push_id = commit.meta.get("push_id", commit.id)
        if push_id in seen:
            continue
        seen.add(push_id)
        if commit.meta.get("action") == "push" and commit.meta.get("state") in ("done", "started", "failed"):
            return _state_of(node, commit)
    return None


@dataclass
class Record:
    """What a push record says besides its node and state."""

    action: str  # "push" | "rollback"
    subject: str
    meta: dict[str, Any]
    push_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])


def write_records(store: Store, record: Record, rows: list[dict[str, Any]]) -> dict[str, str]:
    """Append one record per row (``node``, ``state``, ``tree`` commit, extra meta) in one
    store write; returns ``{node: record commit}``."""
    now = datetime.now(timezone.utc)
    marks = {}
    with store.importer() as importer:
        for row in rows:
            node = row["node"]
            meta = {**record.meta, **{k: v for k, v in row.items() if k != "tree"}, "v": 1, "kind": "push",
                    "action": record.action, "push_id": record.push_id, "time": now.isoformat(timespec="seconds")}
            manifest = store.manifest(row["tree"]) if row.get("tree") else Manifest()
            subject = f"{record.subject} on {node}: {row['state']}"
            marks[node] = importer.commit(refs.push_ref(node), store.ref(refs.push_ref(node)), manifest,
                                          format_message(subject, meta), now)
    return {node: importer.results[mark] for node, mark in marks.items()}


# -- applying ----------------------------------------------------------------------------
@dataclass
class NodeRun:
    """What applying one node's plan did."""

    node: str
    state: str = "not-started"  # done | rolled-back | failed | cancelled
    before: str | None = None
    after: str | None = None
    record: str | None = None
    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytecode_removed: list[str] = field(default_factory=list)
    health: str | None = None
    error: SnapverError | None = None
    rollback_error: SnapverError | None = None
    seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return self.error.exit_code
        return 0 if self.state == "done" else 1

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "state": self.state, "before": self.before, "after": self.after,
                "record": self.record, "written": self.written, "deleted": self.deleted,
                "bytecode_removed": self.bytecode_removed, "health": self.health,
                "error": str(self.error) if self.error else None,
                "rollback_error": str(self.rollback_error) if self.rollback_error else None,
                "seconds": round(self.seconds, 3)}


def _snapshot(store: Store, plans: list[NodePlan],
              event: dict[str, str] | None = None) -> dict[str, str | SnapverError]:
    """Snapshot the plans' nodes, over the connections they already have open (``event``:
    what made the snapshots, see ``pull_locked``)."""
    from snapver.ops.pull import pull_locked

    found: dict[str, str | SnapverError] = {}
    opened = {p.node: p.transport for p in plans if p.transport is not None}
    # The content the plans write: its digests are known, no need to read it back.
    written = {s.target.oid: s.target.digest for p in plans for s in p.writes if s.target is not None}
    for result in pull_locked(store, [p.spec for p in plans], open_transports=opened, known_digests=written,
                              event=event).nodes:
        head = result.snapshot or result.unchanged_since
        found[result.node] = result.error or head or StoreError(f"{result.node}: no snapshot was recorded")
    return found


def _restore(store: Store, plan: NodePlan, paths: list[str], target: Manifest) -> None:
    """Put ``paths`` back as ``target`` holds them (a fresh connection if the old one died)."""
    for attempt in range(2):
        if plan.transport is None or attempt:
            plan.close()
            plan.transport = open_node(plan.spec)
        try:
            live = check_paths(plan.transport, plan.spec, paths)
            write_node(store, plan.transport, plan.spec, restore_steps(live, {p: target.get(p) for p in paths}))
            return
        except TransportError:
            if attempt:
                raise


def execute(store: Store, plans: list[NodePlan], record: Record, health: str | None = None,
            health_timeout: float = 300.0, keep_going: bool = False, undo_failed: bool = True,
            on_node: Callable[[NodeRun], None] | None = None) -> list[NodeRun]:
    """Apply every plan that has writes (see the module docstring for the order)."""
    busy = [p for p in plans if p.writes]
    runs = {p.node: NodeRun(p.node) for p in busy}
    if not busy:
        return []
    with store.lock():
        before = _snapshot(store, busy)
        failed = {node: v for node, v in before.items() if isinstance(v, SnapverError)}
        if failed:
            node, error = sorted(failed.items())[0]
            raise type(error)(f"cannot snapshot {node} before writing, so nothing was written: {error.message}",
                              hint=error.hint)
        rows = []
        for plan in busy:
            prior = newest_record(store, plan.node, check_lock=False)
            carried = prior is not None and prior.state in ("started", "failed")
            rows.append({"node": plan.node, "state": "started", "tree": before[plan.node],
                         "before": before[plan.node],
                         "restore": prior.restore if carried and prior else before[plan.node],
                         "files": _files_meta(plan)})
            runs[plan.node].before = str(before[plan.node])
        started = write_records(store, record, rows)
        for node, commit in started.items():
            runs[node].record = commit
        restore_of = {row["node"]: row["restore"] for row in rows}
        stop = threading.Event()

        def apply(plan: NodePlan) -> None:
            run = runs[plan.node]
            began = time.monotonic()
            if stop.is_set() and not keep_going:
                return
            try:
                if plan.transport is None:
                    plan.transport = open_node(plan.spec)
                result = write_node(store, plan.transport, plan.spec, plan.steps)
                run.written, run.deleted, run.bytecode_removed = result.written, result.deleted, result.bytecode_removed
                if health:
                    run.health = run_health(plan.transport, plan.spec, health, health_timeout)
                run.state = "done"
            except SnapverError as exc:
                run.error = exc
                run.state = "failed"
                stop.set()
                if undo_failed:
                    _undo(plan, run)
            finally:
                run.seconds = time.monotonic() - began

        def _undo(plan: NodePlan, run: NodeRun) -> None:
            try:
                _restore(store, plan, [s.path for s in plan.writes], store.manifest(str(run.before)))
                run.state = "rolled-back"
            except SnapverError as exc:
                run.rollback_error = exc
                run.state = "failed"

        with ThreadPoolExecutor(min(MAX_PARALLEL, len(busy))) as pool:
            list(pool.map(apply, busy))
            if stop.is_set() and not keep_going:
                list(pool.map(lambda p: _undo(p, runs[p.node]) if runs[p.node].state == "done" else None, busy))
        touched = [p for p in busy if runs[p.node].state != "not-started" or runs[p.node].error]
        made_by = {"event": record.action, **({"patch": record.meta["patch"]} if record.meta.get("patch") else {})}
        after = _snapshot(store, touched, made_by) if touched else {}
        rows = []
        for plan in busy:
            run = runs[plan.node]
            snap = after.get(plan.node)
            run.after = snap if isinstance(snap, str) else None
            if run.state == "not-started":
                run.state = "cancelled"  # another node failed first: never written
            errors = [str(e) for e in (run.error, run.rollback_error, snap) if isinstance(e, SnapverError)]
            rows.append({"node": plan.node, "state": run.state, "tree": run.after or run.before,
                         "before": run.before, "after": run.after, "restore": restore_of[plan.node],
                         "files": _files_meta(plan), "written": len(run.written), "deleted": len(run.deleted),
                         "bytecode_removed": len(run.bytecode_removed), "error": "; ".join(errors) or None})
        for node, commit in write_records(store, record, rows).items():
            runs[node].record = commit
    for plan in busy:
        if on_node:
            on_node(runs[plan.node])
    return [runs[p.node] for p in busy]


def _files_meta(plan: NodePlan) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for step in plan.steps:
        key = "forced" if step.forced else step.action
        files.setdefault(key, []).append(step.path)
    return files
