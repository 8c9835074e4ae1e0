"""Rollback: undo the last push that changed a node — or, with ``--to``, restore the
node's tracked tree exactly to a snapshot (content, mode, links, deletions, additions).

Undoing a push touches only the files that push wrote, and each only while it still holds
exactly what the push wrote: a file changed since (by another push, another engineer's
store, a hand edit) is a conflict that refuses the rollback, unless ``force``. This also
repairs a push that was killed half-way. Same plan/apply path as push."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from snapver.config import Config
from snapver.errors import ConflictError, RefError, SnapverError
from snapver.model import Entry, Manifest
from snapver.ops.hooks import Hooks
from snapver.ops.ledger import PushState, Record, last_push, newest_record, write_records
from snapver.ops.live import list_live
from snapver.ops.nodeio import check_paths, open_node
from snapver.ops.plan import MAX_PARALLEL, Live, NodePlan, first_of, restore_steps, undo_steps, within
from snapver.ops.run import NodeRun, Pauses, execute
from snapver.ops.scope import commit_scope, left_out, maybe_excluded, node_scope, unrecorded_note
from snapver.ops.waves import WavesOutcome, run_waves
from snapver.refs import resolve_snapshot
from snapver.store import refs
from snapver.store.repo import Store


@dataclass
class RollbackPlan:
    """Restore ``node`` to snapshot ``target``; ``reason`` says where the target came from."""

    node: NodePlan
    target: str
    reason: str
    interrupted: PushState | None = None
    ignored: int = 0  # entries of the target outside the node's tracked paths
    force: bool = False

    @property
    def nothing_to_do(self) -> bool:
        return not self.node.writes

    def refusal(self) -> ConflictError | None:
        """Files changed since the push wrote them refuse the rollback (None: it may go on)."""
        if not self.node.conflicts:
            return None
        paths = [step.path for step in self.node.conflicts]
        return ConflictError(f"rollback refused: {len(paths)} file(s) on {self.node.node} changed since the push "
                             f"wrote them: {first_of(paths)}; nothing was written",
                             hint=f"see them with `snapver diff {self.node.node}`; --force restores them anyway")

    def close(self) -> None:
        self.node.close()

    def __enter__(self) -> RollbackPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node.node, "target": self.target, "reason": self.reason,
                "interrupted": self.interrupted.to_json() if self.interrupted else None,
                "nothing_to_do": self.nothing_to_do, "plan": self.node.to_json()}


def default_target(store: Store, node: str, notes: list[str] | None = None) -> tuple[PushState, str]:
    """The node's last push (or interrupted push), whose ``restore`` is the snapshot from
    before it, and why it is the target (naming who pushed, in a team store)."""
    pushed = last_push(store, node, notes)
    if pushed is None or not pushed.restore:
        raise RefError(f"no push to {node} is recorded, so there is nothing to roll back to",
                       hint=f"name a snapshot: `snapver rollback {node} --to REF`")
    how = "interrupted push" if pushed.state == "started" else "push"
    by = f" by {pushed.writer!r}" if pushed.writer else ""
    return pushed, f"before the {how} of {pushed.patch}{by} ({pushed.time:%Y-%m-%d %H:%M})"


def pushed_files(store: Store, pushed: PushState) -> dict[str, Entry | None] | None:
    """What a push wrote on each path it touched (None: deleted), from its record and its
    patch; None when the record does not say (a record of an older snapver)."""
    meta = store.commit(pushed.record).meta
    files = meta.get("files")
    source = meta.get("patch_commit") or pushed.after
    if not isinstance(files, dict) or not source:
        return None
    patched = store.manifest(source)
    return {path: patched.get(path) for key in ("write", "delete", "forced") for path in files.get(key) or ()}


def plan_rollback(store: Store, config: Config, node: str, to: str | None = None,
                  force: bool = False) -> RollbackPlan:
    """Plan the rollback: without ``to``, undo the node's last push (only the files it
    wrote, each only while it still holds what the push wrote, unless ``force``); with
    ``to``, what makes the node exactly that snapshot, over the paths both it and the
    node's config observe (see ``_outside_both_scopes``)."""

    spec = config.node(node)
    notes: list[str] = []
    if to is None:
        pushed, reason = default_target(store, spec.name, notes)
        target, wrote = str(pushed.restore), pushed_files(store, pushed)
    else:
        target, reason = resolve_snapshot(store, config, to), f"--to {to}"
        wrote = None
    manifest = store.manifest(target)
    wanted: dict[str, Entry | None] = {e.path: e for e in manifest if within(e.path, spec.paths)}
    prior = newest_record(store, spec.name)
    plan = RollbackPlan(NodePlan(spec), target, reason, prior if prior and prior.interrupted else None,
                        len(manifest) - len(wanted), force)
    plan.node.notes.extend(notes)
    if to is None and prior is not None and prior.action == "push" and prior.state == "cancelled":
        plan.node.notes.append(f"the newest push ({prior.patch}) never reached {spec.name} (its rollout stopped "
                               f"in waves): this undoes the push before it")
    try:
        plan.node.transport = open_node(spec)
        if wrote is not None:
            plan.node.steps = _undo_push_steps(plan.node, wrote, manifest, force)
            return plan
        listing = list_live(store, plan.node.transport)
    except SnapverError:
        plan.close()
        raise
    live = {e.path: Live(e.kind, e.oid, e.mode) for e in listing.entries}
    for path in _outside_both_scopes(store, plan, to, live, wanted):
        live.pop(path, None)
        wanted.pop(path, None)
    plan.node.steps = restore_steps(live, wanted)
    if plan.ignored:
        plan.node.notes.append(f"{plan.ignored} path(s) of {target[:10]} lie outside the node's tracked paths "
                               f"({', '.join(spec.paths)}) and are left alone")
    return plan


def _outside_both_scopes(
    store: Store, plan: RollbackPlan, to: str | None, live: dict[str, Live], wanted: dict[str, Entry | None]
) -> set[str]:
    """The paths a restore must leave alone: outside what the snapshot observed (a file it
    only excluded is not a file it lacked) or what the node's config tracks now. The plan
    notes them, and says so when the snapshot does not record its scope."""
    spec = plan.node.spec
    label = f"{to} ({plan.target[:10]})" if to is not None else plan.target[:10]
    now = node_scope(spec)
    taken = commit_scope(store, store.commit(plan.target), now)
    if not taken.recorded:
        plan.node.notes.append(unrecorded_note(label, taken))
    found = left_out(live, wanted, taken, now, f"when {label} was taken", f"by {spec.name}'s config now")
    dropped = {path for out in found for path in out.paths}
    unsure = maybe_excluded(wanted, (path for path in live if path not in wanted and path not in dropped), taken,
                            f"when {label} was taken, perhaps")
    found += [unsure] if unsure is not None else []
    plan.node.notes += [out.note("left alone") for out in found]
    return {path for out in found for path in out.paths}


def _undo_push_steps(node: NodePlan, wrote: dict[str, Entry | None], before: Manifest, force: bool) -> list:
    assert node.transport is not None
    paths = [path for path in wrote if within(path, node.spec.paths)]
    live = check_paths(node.transport, node.spec, paths)
    return undo_steps(live, {p: wrote[p] for p in paths}, {p: before.get(p) for p in paths}, force)


def apply_rollback(store: Store, plan: RollbackPlan, hooks: dict[str, Hooks] | None = None,
                   after_interrupt: bool = False, pauses: Pauses | None = None) -> NodeRun | None:
    """Write the plan; with nothing to write, only close an interrupted push's record.
    Refuses a plan with conflicts (files changed since the push wrote them). ``hooks``:
    restart and health checks after writing (a failure is reported; the restored files stay).
    ``after_interrupt``: undoing what an interrupted command wrote: run in full. ``pauses``:
    where to hold the writes (``ops/run.Pauses``)."""
    refusal = plan.refusal()
    if refusal is not None:
        raise refusal
    record = Record("rollback", f"rollback to {plan.target[:10]}", {"target": plan.target, "reason": plan.reason,
                                                                    "patch": None})
    if plan.nothing_to_do:
        if plan.interrupted is None:
            return None
        with store.lock():
            head = store.ref(refs.node_ref(plan.node.node)) or plan.target
            commit = write_records(store, record, [{"node": plan.node.node, "state": "done", "tree": head,
                                                    "before": head, "after": head, "written": 0, "deleted": 0}])
        return NodeRun(plan.node.node, "done", head, head, commit[plan.node.node])
    runs = execute(store, [plan.node], record, undo_failed=False, hooks=hooks, after_interrupt=after_interrupt,
                   pauses=pauses)
    return runs[0]


# -- several nodes, in waves -------------------------------------------------------------
@dataclass
class RollbacksResult:
    """Several nodes rolled back at once, or in waves (``waves``: where the rollout got to)."""

    plans: list[RollbackPlan]
    runs: list[NodeRun] = field(default_factory=list)
    waves: WavesOutcome | None = None

    @property
    def exit_code(self) -> int:
        return max((run.exit_code for run in self.runs), default=0)

    def run_of(self, node: str) -> NodeRun | None:
        return next((run for run in self.runs if run.node == node), None)

    def to_json(self) -> dict[str, Any]:
        nodes = []
        for plan in self.plans:
            run = self.run_of(plan.node.node)
            nodes.append({**plan.to_json(), "result": run.to_json() if run else None})
        return {"nodes": nodes, **(self.waves.to_json() if self.waves else {}), "exit_code": self.exit_code}


def plan_rollbacks(store: Store, config: Config, targets: list[str], to: str | None = None,
                   force: bool = False) -> list[RollbackPlan]:
    """``plan_rollback`` for every node of ``targets`` (nodes or groups), asked in parallel;
    the first node that cannot be planned refuses them all (the others' connections closed)."""
    specs = config.select(targets, False)
    with ThreadPoolExecutor(max(1, min(MAX_PARALLEL, len(specs)))) as pool:
        futures = [pool.submit(plan_rollback, store, config, spec.name, to, force) for spec in specs]
    plans, failures = [], []
    for future in futures:
        try:
            plans.append(future.result())
        except SnapverError as exc:
            failures.append(exc)
    if failures:
        for plan in plans:
            plan.close()
        raise failures[0]
    return plans


def rollbacks_refusal(plans: list[RollbackPlan]) -> ConflictError | None:
    """Files changed since the push wrote them, on any node, refuse every rollback (None:
    they may go on); its exit code is the plans' own."""
    conflicted = [plan for plan in plans if plan.node.conflicts]
    if not conflicted:
        return None
    paths = [f"{plan.node.node}:{step.path}" for plan in conflicted for step in plan.node.conflicts]
    return ConflictError(f"rollback refused: {len(paths)} file(s) changed since the push wrote them: "
                         f"{first_of(paths)}; nothing was written",
                         hint=f"see them with `snapver diff {conflicted[0].node.node}`; --force restores them "
                              "anyway")


def apply_rollbacks(store: Store, plans: list[RollbackPlan], hooks: dict[str, Hooks] | None = None,
                    waves: str | None = None, between: Callable[[int, list[str]], bool] | None = None,
                    on_wave: Callable[[int, list[NodeRun]], None] | None = None,
                    pauses: Pauses | None = None) -> RollbacksResult:
    """Write every plan: all at once, or in ``waves`` (see ``ops/waves.run_waves``: each
    wave restored, restarted and health-checked before the next; a node that fails stops
    the rollout, later waves untouched and recorded "cancelled"). One node's failure never
    undoes another node's rollback. Refuses, with nothing written, when any plan has
    conflicts; a plan with nothing to write only closes an interrupted push's record."""
    refusal = rollbacks_refusal(plans)
    if refusal is not None:
        raise refusal
    result = RollbacksResult(plans)
    for plan in plans:
        if plan.nothing_to_do and plan.interrupted is not None:
            repaired = apply_rollback(store, plan)
            if repaired is not None:
                result.runs.append(repaired)
    busy = [plan for plan in plans if not plan.nothing_to_do]
    if not busy:
        return result
    targets = {plan.target for plan in busy}
    record = Record("rollback", f"rollback to {next(iter(targets))[:10]}" if len(targets) == 1 else "rollback",
                    {"patch": None}, per_node={plan.node.node: {"target": plan.target, "reason": plan.reason}
                                               for plan in busy})

    def run_wave(wave: list[NodePlan]) -> list[NodeRun]:
        # keep_going: a node that fails is no reason to put the push back on the others.
        return execute(store, wave, record, keep_going=True, undo_failed=False, hooks=hooks, pauses=pauses)

    if waves is None:
        result.runs.extend(run_wave([plan.node for plan in busy]))
    else:
        result.waves = run_waves(store, [plan.node for plan in busy], waves, record, run_wave, between, on_wave)
        result.runs.extend(result.waves.runs)
    return result
