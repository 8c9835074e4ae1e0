"""Applying plans: the one apply path that push and rollback share.

Under the store lock: snapshot each node (before), write a push record ("started") on
``refs/heads/pushes/<node>`` — so a push killed at any later moment is visible and can
be rolled back — then write the nodes in parallel, run the health check, roll back
failed nodes (and, unless ``keep_going``, the others), snapshot them again (after) and
mark each record with its final state.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from snapver import interrupt
from snapver.errors import Cancelled, SnapverError, StoreError
from snapver.model import Entry
from snapver.ops.hooks import Hooks, hooks_again, run_health, run_hooks
from snapver.ops.layer import identities
from snapver.ops.ledger import Record, newest_record, write_records
from snapver.ops.nodeio import left_alone_error, open_node, undo_node, write_node
from snapver.ops.plan import MAX_PARALLEL, WRITE, NodePlan
from snapver.ops.snapshot import pull_locked
from snapver.store.repo import Store


@dataclass(frozen=True)
class Pauses:
    """Where a caller may hold a run (a test races or kills a push there): ``sent(n)``
    once the n-th file is sent to a node (undos included), ``written(node)`` once a node
    is written, before its health check."""

    sent: Callable[[int], None] | None = None
    written: Callable[[str], None] | None = None


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
    hooks_log: list[str] = field(default_factory=list)  # restart and health, after writing
    recovery_log: list[str] = field(default_factory=list)  # the same, on the restored code after an undo
    recovery_error: SnapverError | None = None
    hooks_started: bool = False  # the restart may have run: an undo restarts again

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
                "hooks": self.hooks_log, "recovery": self.recovery_log,
                "recovery_error": str(self.recovery_error) if self.recovery_error else None,
                "seconds": round(self.seconds, 3)}


def _snapshot(store: Store, plans: list[NodePlan],
              event: dict[str, str] | None = None) -> dict[str, str | SnapverError]:
    """Snapshot the plans' nodes, over the connections they already have open (``event``:
    what made the snapshots, see ``pull_locked``)."""

    found: dict[str, str | SnapverError] = {}
    opened = {p.node: p.transport for p in plans if p.transport is not None}
    # The content the plans write: its digests are known, no need to read it back.
    written = {s.target.oid: s.target.digest for p in plans for s in p.writes if s.target is not None}
    for result in pull_locked(store, [p.spec for p in plans], open_transports=opened, known_digests=written,
                              event=event).nodes:
        head = result.snapshot or result.unchanged_since
        found[result.node] = result.error or head or StoreError(f"{result.node}: no snapshot was recorded")
    return found


def execute(store: Store, plans: list[NodePlan], record: Record, health: str | None = None,
            health_timeout: float = 300.0, keep_going: bool = False, undo_failed: bool = True,
            on_node: Callable[[NodeRun], None] | None = None,
            hooks: dict[str, Hooks] | None = None, after_interrupt: bool = False,
            pauses: Pauses | None = None) -> list[NodeRun]:
    """Apply every plan that has writes (see the module docstring for the order).

    ``hooks`` (per node): after the write, restart and wait until healthy; a failure
    rolls the node back like a failed health check, then restarts it on the restored
    code (``recovery_log``, ``recovery_error``). A node rolled back because another
    failed is restarted on its restored code too.

    An interrupt (Ctrl-C, SIGTERM) stops the nodes still sending (nothing is committed
    there: ``cancelled``), undoes by the compare-and-swap rule the nodes already written,
    records the outcome and returns; the caller then raises the interrupt.
    ``after_interrupt``: an undo of what an interrupted command wrote, run in full.
    ``pauses``: where to hold the run (see ``Pauses``).
    """
    busy = [p for p in plans if p.writes]
    if not busy:
        return []
    runs = Execution(store, busy, record, health, health_timeout, keep_going, undo_failed, hooks,
                     after_interrupt, pauses or Pauses()).run()
    for run in runs:
        if on_node:
            on_node(run)
    return runs


@dataclass
class Execution:
    """One application of ``plans`` (each with writes), in named steps: snapshot before,
    record started, apply (undo), stop in order, snapshot after, record outcome. Its
    fields are what the steps share; the node threads each touch their own node's run."""

    store: Store
    plans: list[NodePlan]
    record: Record
    health: str | None = None
    health_timeout: float = 300.0
    keep_going: bool = False
    undo_failed: bool = True
    hooks: dict[str, Hooks] | None = None
    after_interrupt: bool = False
    pauses: Pauses = field(default_factory=Pauses)
    runs: dict[str, NodeRun] = field(init=False)
    wrote_of: dict[str, dict[str, Entry | None]] = field(init=False)  # what each plan writes (None: deletes)
    restore_of: dict[str, Any] = field(default_factory=dict)  # each record's restore point
    stop: threading.Event = field(default_factory=threading.Event)  # a node failed
    undone: set[str] = field(default_factory=set)
    # Nodes whose write reply came: they wrote exactly run.written/deleted.
    answered: set[str] = field(default_factory=set)
    interrupted: bool = False

    def __post_init__(self) -> None:
        self.runs = {p.node: NodeRun(p.node) for p in self.plans}
        self.wrote_of = {p.node: {s.path: s.target if s.action == WRITE else None for s in p.writes}
                         for p in self.plans}

    def run(self) -> list[NodeRun]:
        """Every step in order, under the store lock; returns each plan's run."""
        with self.store.lock():
            self.record_started(self.snapshot_before())
            after = self.write_all()
            self.record_outcome(after)
        return [self.runs[p.node] for p in self.plans]

    def snapshot_before(self) -> dict[str, str | SnapverError]:
        """Snapshot every node; one that cannot be snapshotted refuses them all, unwritten."""
        # Labelled as what takes it (log showed it as a pull): "before-push NAME", "before-rollback".
        before = _snapshot(self.store, self.plans, {"event": f"before-{self.record.action}",
                                                   **({"patch": self.record.meta["patch"]}
                                                      if self.record.meta.get("patch") else {})})
        failed = {node: v for node, v in before.items() if isinstance(v, SnapverError)}
        if failed:
            node, error = sorted(failed.items())[0]
            raise type(error)(f"cannot snapshot {node} before writing, so nothing was written: {error.message}",
                              hint=error.hint)
        return before

    def record_started(self, before: dict[str, str | SnapverError]) -> None:
        """A "started" record per node, restoring to its snapshot (or, after an unfinished
        push, to the point that push would have restored)."""
        rows: list[dict[str, Any]] = []
        ids = identities(plan.spec for plan in self.plans)  # the containers written into
        for plan in self.plans:
            prior = newest_record(self.store, plan.node, check_lock=False)
            carried = prior is not None and prior.state in ("started", "failed")
            rows.append({"node": plan.node, "state": "started", "tree": before[plan.node],
                         "before": before[plan.node],
                         "restore": prior.restore if carried and prior else before[plan.node],
                         "files": _files_meta(plan), "container": ids[plan.node]})
            self.runs[plan.node].before = str(before[plan.node])
        started = write_records(self.store, self.record, rows)
        for node, commit in started.items():
            self.runs[node].record = commit
        self.restore_of = {row["node"]: row["restore"] for row in rows}

    def write_all(self) -> dict[str, str | SnapverError]:
        """Apply the plans in parallel; after a failure (unless ``keep_going``) or an
        interrupt, undo the nodes written; then snapshot the nodes touched."""
        with interrupt.deferred(), ThreadPoolExecutor(min(MAX_PARALLEL, len(self.plans))) as pool:
            futures = {pool.submit(task): plans for task, plans in self.tasks()}
            try:
                while wait(futures, timeout=0.2).not_done:
                    pass
            except KeyboardInterrupt:
                self.interrupted = True
                self.stop_in_order(futures)
            if self.interrupted or (self.stop.is_set() and not self.keep_going):
                again = [p for p in self.plans if p.node not in self.undone and (
                    self.runs[p.node].state == "done" or (self.interrupted and self.runs[p.node].state == "failed"))]
                self.undo_all(pool, again)
            return self.snapshot_after()

    def tasks(self) -> list[tuple[Callable[[], None], list[NodePlan]]]:
        """What the pool runs, and the plans each task writes: here one ``apply`` per plan."""
        return [(functools.partial(self.apply, plan), [plan]) for plan in self.plans]

    def node_failed(self, plan: NodePlan) -> None:
        """A node failed: the nodes not yet started stop (unless ``keep_going``)."""
        self.stop.set()

    def undo_all(self, pool: ThreadPoolExecutor, plans: list[NodePlan]) -> None:
        """Undo ``plans`` after a failure or an interrupt, in parallel."""
        list(pool.map(self.undo, plans))

    def apply(self, plan: NodePlan) -> None:
        """Write one node, then its health check and hooks; a failure undoes it (``undo_failed``)."""
        run = self.runs[plan.node]
        began = time.monotonic()
        if (self.stop.is_set() and not self.keep_going) or (interrupt.requested() and not self.after_interrupt):
            return
        try:
            if plan.transport is None:
                plan.transport = open_node(plan.spec)
            result = write_node(self.store, plan.transport, plan.spec, plan.steps, abortable=not self.after_interrupt,
                                on_sent=self.pauses.sent)
            run.written, run.deleted, run.bytecode_removed = result.written, result.deleted, result.bytecode_removed
            self.answered.add(plan.node)
            if result.error is not None:
                raise result.error
            if self.pauses.written is not None:
                self.pauses.written(plan.node)
            if self.health:
                run.health = run_health(plan.transport, plan.spec, self.health, self.health_timeout)
            if self.hooks and self.hooks.get(plan.node):
                run.hooks_started = True
                run_hooks(plan.transport, plan.spec, self.hooks[plan.node], run.hooks_log)
            run.state = "done"
        except Cancelled as exc:
            run.error, run.state = exc, "cancelled"  # stopped while sending: nothing committed there
        except SnapverError as exc:
            run.error, run.state = exc, "failed"
            self.node_failed(plan)
            if self.undo_failed and not interrupt.requested():
                self.undo(plan)
        finally:
            run.seconds = time.monotonic() - began

    def undo(self, plan: NodePlan) -> None:
        """Put back what this run wrote on one node (compare-and-swap), then restart it on
        the restored code if its hooks may have restarted it on the new."""
        run = self.runs[plan.node]
        self.undone.add(plan.node)
        wrote = self.wrote_of[plan.node]
        if plan.node in self.answered:  # else (a connection lost mid-write) any planned path may be written
            wrote = {path: wrote[path] for path in run.written + run.deleted}
        try:
            left = undo_node(self.store, plan, wrote, self.store.manifest(str(run.before)),
                             self.pauses.sent) if wrote else []
        except SnapverError as exc:
            run.rollback_error, run.state = exc, "failed"
            return
        if left:
            run.rollback_error, run.state = left_alone_error(plan.node, left), "failed"
        else:
            run.state = "rolled-back"
        node_hooks = (self.hooks or {}).get(plan.node)
        if node_hooks and node_hooks.restart and run.hooks_started and not interrupt.requested():
            run.recovery_error = hooks_again(plan, node_hooks, run.recovery_log)

    def stop_in_order(self, futures: dict[Future[None], list[NodePlan]]) -> None:
        """After an interrupt: nodes still sending stop by themselves at their next piece; any
        still busy a moment later (waiting for a reply) have their connection cut."""
        if wait(futures, timeout=interrupt.GRACE).not_done:
            busy = [plan for f in futures if not f.done() for plan in futures[f]]
            interrupt.cut_all([plan.transport for plan in busy if plan.transport is not None])
            wait(futures, timeout=10)

    def snapshot_after(self) -> dict[str, str | SnapverError]:
        """Snapshot the nodes this run touched (fresh connections for those the interrupt cut)."""
        touched = [p for p in self.plans if self.runs[p.node].state != "not-started" or self.runs[p.node].error]
        for plan in touched:
            if plan.transport is not None and not plan.transport.is_open:
                plan.close()  # cut by the interrupt: the snapshot connects again
        made_by = {"event": self.record.action,
                   **({"patch": self.record.meta["patch"]} if self.record.meta.get("patch") else {})}
        return _snapshot(self.store, touched, made_by) if touched else {}

    def record_outcome(self, after: dict[str, str | SnapverError]) -> None:
        """Each node's record says its final state; a full store names the nodes left written."""
        ids = identities(plan.spec for plan in self.plans)  # a restart may have made a new container
        rows = [{**self._outcome_row(plan, after.get(plan.node)), "container": ids[plan.node]} for plan in self.plans]
        try:
            finished = write_records(self.store, self.record, rows)
        except StoreError as exc:
            patched = [n for n, r in self.runs.items() if r.state == "done" or (r.state == "failed" and r.written)]
            if not patched:
                raise
            raise StoreError(f"{exc.message}; {', '.join(patched)} {'was' if len(patched) == 1 else 'were'} "
                             "written, but the push's outcome could not be recorded (its record says started)",
                             hint=f"make room for the store, then `snapver rollback {patched[0]}` restores "
                                  "it") from exc
        for node, commit in finished.items():
            self.runs[node].record = commit

    def _outcome_row(self, plan: NodePlan, snap: str | SnapverError | None) -> dict[str, Any]:
        run = self.runs[plan.node]
        run.after = snap if isinstance(snap, str) else None
        if run.state == "not-started":
            run.state = "cancelled"  # another node failed first, or an interrupt: never written
        errors = [str(e) for e in (run.error, run.rollback_error, snap) if isinstance(e, SnapverError)]
        return {"node": plan.node, "state": run.state, "tree": run.after or run.before,
                "before": run.before, "after": run.after, "restore": self.restore_of[plan.node],
                "files": _files_meta(plan), "written": len(run.written), "deleted": len(run.deleted),
                "bytecode_removed": len(run.bytecode_removed), "interrupted": self.interrupted,
                "error": "; ".join(errors) or None}


def _files_meta(plan: NodePlan) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for step in plan.steps:
        key = "forced" if step.forced else step.action
        files.setdefault(key, []).append(step.path)
    return files
