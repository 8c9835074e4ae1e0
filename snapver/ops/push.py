"""Push: apply a patch to live nodes — all of them exactly, or none.

Plan: for every target, the node reports each path the patch touches; a path that
equals the patch is skipped, one that equals the base is written, anything else is a
conflict and refuses the whole push before any node is written (``force`` overwrites
instead). A file that would land broken — unresolved conflict markers, or a ``.py`` file
the node's own Python does not compile — refuses it too (``allow_broken`` overrides,
``force`` does not). Apply: the shared path in ``ops/run.py`` (records, snapshots, atomic
writes, health check, roll back on failure).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from snapver import interrupt
from snapver.config import Config, NodeSpec, parse_waves
from snapver.errors import ConflictError, RemoteError, SnapverError, UsageError
from snapver.failbudget import allowed_failures
from snapver.model import FILE
from snapver.ops.broken import BrokenFile, big_binary, conflict_markers, syntax_error
from snapver.ops.hooks import Hooks
from snapver.ops.layer import layer_warning
from snapver.ops.ledger import PushState, Record, newest_record
from snapver.ops.nodeio import check_paths, open_node
from snapver.ops.patch import Patch, load_patch, unsaved_edits, unseen_versions
from snapver.ops.plan import MAX_PARALLEL, WRITE, NodePlan, Step, classify, within
from snapver.ops.rollback import apply_rollback, plan_rollback
from snapver.ops.run import NodeRun, Pauses
from snapver.ops.units import Rollout, Unit, check_whole_groups, failed_units, plan_units, unit_plans
from snapver.ops.waves import FAILED, INTERRUPTED, run_waves
from snapver.store.repo import Store
from snapver.store.team import AUTO_SYNC_TIMEOUT, remote_versions_unseen

__all__ = ["PushPlan", "PushResult", "plan_push", "apply_push", "push_state"]


def push_state(store: Store, node: str) -> PushState | None:
    """The node's newest push record: ``.interrupted`` when a push (or rollback) began
    writing and never finished — `snapver rollback NODE` repairs it."""
    return newest_record(store, node)


@dataclass
class PushPlan:
    """The plan of one push: per node, each touched file's step. Close it when done."""

    patch: Patch
    nodes: list[NodePlan]
    force: bool = False
    broken: list[BrokenFile] = field(default_factory=list)  # files that would land broken
    allow_broken: bool = False
    units: list[Unit] = field(default_factory=list)  # what waves count: serving groups whole, other nodes alone
    unsaved: list[str] = field(default_factory=list)  # edited in the patch's checkout, not saved

    @property
    def refused_broken(self) -> bool:
        """True when broken files refuse the push (no ``--allow-broken``)."""
        return bool(self.broken) and not self.allow_broken

    @property
    def conflicts(self) -> list[tuple[str, Step]]:
        return [(n.node, s) for n in self.nodes for s in n.conflicts]

    @property
    def errors(self) -> list[NodePlan]:
        return [n for n in self.nodes if n.error is not None]

    @property
    def nothing_to_do(self) -> bool:
        return not self.errors and not self.conflicts and not any(n.writes for n in self.nodes)

    @property
    def exit_code(self) -> int:
        """The exit code of a push that stops at this plan (a dry run, or a refusal)."""
        if self.conflicts or self.refused_broken:
            return 1
        return max((n.error.exit_code for n in self.errors if n.error), default=0)

    def refusal(self, keep_going: bool = False) -> SnapverError | None:
        """Why this plan may not be written: conflicts (unless it was made with ``force``),
        broken files, or unreachable nodes (unless ``keep_going``); None when it may."""
        if self.conflicts:
            nodes = sorted({node for node, _ in self.conflicts})
            return ConflictError(f"push refused: {len(self.conflicts)} conflicting file(s) on {', '.join(nodes)}; "
                                 "no node was changed", hint="--force overwrites them (rollback can undo it)")
        if self.refused_broken:
            return ConflictError(f"push refused: {len(self.broken)} file(s) would land broken: "
                                 + "; ".join(str(b) for b in self.broken) + "; no node was changed",
                                 hint=f"fix them (`snapver patch new {self.patch.name}`, edit, `snapver patch save "
                                 f"{self.patch.name}`); --allow-broken pushes them anyway (recorded)")
        if self.errors and not keep_going:
            first = self.errors[0].error
            assert first is not None
            return type(first)(f"push refused, no node was changed: {first.message}", hint=first.hint)
        return None

    @property
    def layer_warning(self) -> str | None:
        """Said once when the push writes into containers: their writable layer is not forever."""
        return layer_warning(self.patch.name, [n.spec for n in self.nodes if n.writes])

    def close(self) -> None:
        for node in self.nodes:
            node.close()

    def __enter__(self) -> PushPlan:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_json(self) -> dict[str, Any]:
        return {"patch": self.patch.name, "commit": self.patch.commit, "base": self.patch.base,
                "force": self.force, "nothing_to_do": self.nothing_to_do, "allow_broken": self.allow_broken,
                "broken": [b.to_json() for b in self.broken], "units": [u.to_json() for u in self.units],
                "layer_warning": self.layer_warning,
                "unsaved": self.unsaved,
                "nodes": [n.to_json() for n in self.nodes]}




def _plan_node(patch: Patch, spec: NodeSpec, force: bool, python_sources: dict[str, bytes],
               broken: list[BrokenFile]) -> NodePlan:
    plan = NodePlan(spec)
    outside = [f.path for f in patch.files if not within(f.path, spec.paths)]
    if outside:
        plan.error = UsageError(f"{spec.name}: the patch touches {outside[0]}, outside the node's tracked paths "
                                f"({', '.join(spec.paths)})")
        return plan
    try:
        plan.transport = open_node(spec)
        live = check_paths(plan.transport, spec, [f.path for f in patch.files])
        plan.steps = [classify(f, live.get(f.path), force) for f in patch.files]
        # The node's own Python judges the .py files this push would write there.
        landing = [(s.path, python_sources[s.path]) for s in plan.steps
                   if s.action == WRITE and s.path in python_sources]
        refused, too_large = plan.transport.compile_sources(landing)
        for path, (line, message) in sorted(refused.items()):
            broken.append(BrokenFile(path, line, message, spec.name))
        for path in too_large:  # beyond what the node holds at once: this Python judges it
            problem = syntax_error(path, python_sources[path])
            if problem is not None:
                broken.append(problem)
    except SnapverError as exc:
        plan.error = exc
        plan.close()
    return plan


def push_waves(config: Config, waves: str | None, rollback_all: bool = False) -> str | None:
    """The waves of a push: ``waves`` (the command line's), else the config's; a bad spec,
    or ``rollback_all`` without waves, is refused before any node is asked."""
    spec = waves if waves is not None else config.waves
    if spec is not None:
        parse_waves(spec)
    elif rollback_all:
        raise UsageError("--rollback-all rolls back the finished waves of a push in waves",
                         hint="add --waves SPEC (or set waves in [defaults])")
    return spec


def _check_newest_version(store: Store, config: Config, patch: Patch) -> None:
    """Refuse a patch whose newest version this store has not seen: another writer's version
    that the one here does not contain, here after a sync or still only on the team remote
    (checked as ``--force-with-lease`` checks a ref). An unreachable remote is not a refusal."""
    unseen = unseen_versions(store, patch.name)
    if config.remote:
        try:
            unseen.update(remote_versions_unseen(store, config.remote, patch.name, patch.commit, AUTO_SYNC_TIMEOUT))
        except RemoteError:
            pass  # offline: the versions synced here are all that can be known
    if unseen:
        shown = " and ".join(f"{commit[:10]} by {writer}" for writer, commit in sorted(unseen.items()))
        raise ConflictError(f"patch {patch.name!r} has a newer version this one does not include: {shown}",
                            hint=f"`snapver sync`, look at both with `snapver patch show {patch.name} --history`, "
                                 f"then save one version that includes them (`snapver patch new {patch.name}`, "
                                 f"edit, `snapver patch save {patch.name} -m MSG`)")


def plan_push(store: Store, config: Config, name: str, targets: list[str] | None = None,
              all_nodes: bool = False, force: bool = False, allow_broken: bool = False) -> PushPlan:
    """Plan a push of patch ``name`` to ``targets`` (default: the patch's own nodes);
    ``broken`` lists the files that would land with conflict markers or not compile."""
    patch = load_patch(store, name)
    _check_newest_version(store, config, patch)
    names = list(targets or []) or list(patch.nodes)
    if not names and not all_nodes:
        raise UsageError(f"patch {name!r} names no target nodes", hint=f"say where: `snapver push {name} NODE...`")
    specs = config.select(names, all_nodes)
    check_whole_groups(config, [spec.name for spec in specs], name)
    units = plan_units(config, [spec.name for spec in specs])
    if not patch.files:
        return PushPlan(patch, [NodePlan(spec) for spec in specs], force, units=units,
                        unsaved=unsaved_edits(store, config, patch))
    broken, python_sources = _landing_content(store, patch)
    found: dict[str, list[BrokenFile]] = {spec.name: [] for spec in specs}
    with ThreadPoolExecutor(min(MAX_PARALLEL, len(specs))) as pool:
        nodes = list(pool.map(lambda spec: _plan_node(patch, spec, force, python_sources, found[spec.name]), specs))
    broken += [b for spec in specs for b in found[spec.name]]
    for node in nodes:
        prior = newest_record(store, node.node)
        if prior is not None and prior.interrupted:
            node.notes.append(f"an interrupted {prior.action} ({prior.patch or 'rollback'}, "
                              f"{prior.time:%Y-%m-%d %H:%M}) left this node part-written; "
                              f"`snapver rollback {node.node}` restores {str(prior.restore)[:10]}")
    _note_split_groups(units, nodes)
    return PushPlan(patch, nodes, force, broken, allow_broken, units, unsaved=unsaved_edits(store, config, patch))


def _note_split_groups(units: list[Unit], nodes: list[NodePlan]) -> None:
    """A serving group with a node that cannot be planned (not written at all, with
    --keep-going), or only some of whose nodes have something to write (the others are not
    restarted with it): the plan says so."""
    by_name = {node.node: node for node in nodes}
    for unit in units:
        unplanned = [name for name in unit.nodes if unit.serving and by_name[name].error is not None]
        for name in unit.nodes if unplanned else ():
            if name not in unplanned:
                by_name[name].notes.append(f"not written: serving group {unit.name} is written whole, and "
                                           f"{', '.join(unplanned)} cannot be planned")
        idle = [name for name in unit.nodes if unit.serving and not unplanned and not by_name[name].writes]
        if idle and len(idle) < len(unit.nodes):
            for name in idle:
                by_name[name].notes.append(f"nothing to write here, so it is not restarted with serving group "
                                           f"{unit.name} (its other nodes are)")


def _landing_content(store: Store, patch: Patch) -> tuple[list[BrokenFile], dict[str, bytes]]:
    """The patch's files holding conflict markers their base lacks, and the content of its
    ``.py`` files (for each node's Python to compile)."""
    broken: list[BrokenFile] = []
    sources: dict[str, bytes] = {}
    for item in patch.files:
        if item.patch is None or item.patch.kind != FILE or big_binary(store, item.patch):
            continue
        data = store.read_blob(item.patch.oid)
        base = store.read_blob(item.base.oid) if item.base is not None and item.base.kind == FILE else None
        marked = conflict_markers(item.path, data, base)
        if marked is not None:
            broken.append(marked)
        if item.path.endswith(".py"):
            sources[item.path] = data
    return broken, sources


@dataclass
class PushResult:
    plan: PushPlan
    nodes: list[NodeRun] = field(default_factory=list)
    max_fail: int = 0  # the units that could fail, each rolled back, while the push went on

    @property
    def failed_units(self) -> list[Unit]:
        """The units with a node that failed (each rolled back, unless its undo failed)."""
        return failed_units(self.plan.units, self.nodes)

    @property
    def exit_code(self) -> int:
        codes = [n.exit_code for n in self.nodes] + [n.error.exit_code for n in self.plan.errors if n.error]
        return max(codes, default=0)

    @property
    def patched(self) -> list[str]:
        """The nodes this push leaves written: finished, or failed with an undo that did not
        complete (what a push that failed with ``keep_going`` must name)."""
        return [run.node for run in self.nodes if run.state == "done" or run.rollback_error is not None]

    def to_json(self) -> dict[str, Any]:
        return {**self.plan.to_json(), "results": [n.to_json() for n in self.nodes], "patched": self.patched,
                "max_fail": self.max_fail, "failed_units": [u.to_json() for u in self.failed_units],
                "exit_code": self.exit_code}


def apply_push(store: Store, plan: PushPlan, health: str | None = None, health_timeout: float = 300.0,
               keep_going: bool = False, on_node: Callable[[NodeRun], None] | None = None,
               hooks: dict[str, Hooks] | None = None, pauses: Pauses | None = None,
               max_fail: str | None = None) -> PushResult:
    """Write the plan (see ``ops/run.execute``), by units (``ops/units``). Refuses a plan
    with conflicts (unless it was made with ``force``) or with unreachable nodes (unless
    ``keep_going``). ``hooks``: per node, restart and health checks after writing (see
    ``ops/hooks.hooks_for``); ``pauses``: where to hold the writes (``ops/run.Pauses``);
    ``max_fail``: the failure budget (``N`` or ``P%`` of the units): a failed unit within
    it is rolled back and the others go on."""
    refusal = plan.refusal(keep_going)
    if refusal is not None:
        raise refusal
    patch = plan.patch
    record = Record("push", f"push {patch.name}", {"patch": patch.name, "patch_commit": patch.commit,
                                                     "base": patch.base, "health": health, "force": plan.force,
                                                     **_broken_meta(plan),
                                                     **({"hooks": {n: h.to_json() for n, h in hooks.items() if h}}
                                                        if hooks else {})})
    ready = _ready(plan)
    rollout = Rollout(plan.units, allowed_failures(max_fail, len(unit_plans(plan.units, ready))))
    runs = rollout.execute(store, ready, record, keep_going=keep_going, hooks=hooks, pauses=pauses, health=health,
                           health_timeout=health_timeout)
    for run in runs:
        if on_node:
            on_node(run)
    return PushResult(plan, runs, rollout.budget)


def _ready(plan: PushPlan) -> list[NodePlan]:
    """The nodes to write: planned, with writes, and not in a serving group with a node that
    could not be planned (pushed only with --keep-going: a group is written whole or not)."""
    unplanned = {n.node for n in plan.nodes if n.error is not None}
    broken = {node for unit in plan.units if unit.serving and unplanned & set(unit.nodes) for node in unit.nodes}
    return [n for n in plan.nodes if n.error is None and n.writes and n.node not in broken]


def _broken_meta(plan: PushPlan) -> dict[str, Any]:
    """What the push record says of broken files pushed with ``--allow-broken``."""
    if not plan.allow_broken:
        return {}
    return {"allow_broken": True, "broken": [str(b) for b in plan.broken]}


# -- canary waves -----------------------------------------------------------------------
@dataclass
class WavesResult(PushResult):
    """A push in waves: ``finished`` waves of ``waves``; nodes of later waves untouched.
    ``rolled_back``: the rollbacks of the finished waves' nodes after a later wave failed
    (or the push was interrupted); ``why`` it stopped (see ``ops/waves``)."""

    waves: list[list[str]] = field(default_factory=list)
    finished: int = 0
    spec: str = ""
    rolled_back: list[NodeRun] = field(default_factory=list)
    why: str | None = None

    @property
    def stopped(self) -> bool:
        return self.finished < len(self.waves)

    @property
    def exit_code(self) -> int:
        return max([super().exit_code] + [run.exit_code for run in self.rolled_back])

    @property
    def patched(self) -> list[str]:
        # A rollback whose restart or health check failed has restored the files all the same.
        restored = {run.node for run in self.rolled_back if run.state == "done" or run.hooks_started}
        return [node for node in super().patched if node not in restored]

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "waves": self.waves, "waves_finished": self.finished, "waves_spec": self.spec,
                "stopped": self.stopped, "stop_reason": self.why,
                "rolled_back": [run.to_json() for run in self.rolled_back]}


def apply_push_waves(store: Store, config: Config, plan: PushPlan, spec: str, hooks: dict[str, Hooks] | None = None,
                     keep_going: bool = False, between: Callable[[int, list[str]], bool] | None = None,
                     on_wave: Callable[[int, list[NodeRun]], None] | None = None,
                     roll_back_finished: bool | None = None, pauses: Pauses | None = None,
                     max_fail: str | None = None) -> WavesResult:
    """Write the plan wave by wave (see ``ops/waves.run_waves``): each wave is written,
    restarted and health-checked (``execute``) before the next begins. A failed node
    rolls back its wave and the waves that finished before it, unless ``keep_going``
    (SPEC: the nodes already written are rolled back), and stops the push: later waves
    are not written, and their nodes get a "cancelled" record saying where the push
    stopped. A wave that cannot start (a node lost while it waited) and an interrupt
    (in a wave, or the pause before one) end the push by the same rule. ``roll_back_finished``
    overrides whether the finished waves are rolled back (None: unless ``keep_going``).
    ``between(next_wave_index, its nodes)`` may stop the push between waves (False): no
    node failed, so the finished waves stay patched. Waves count units (``ops/units``);
    ``max_fail``: the failure budget, failed units within it rolled back and the push goes on."""
    refusal = plan.refusal(keep_going)
    if refusal is not None:
        raise refusal
    patch = plan.patch
    record = Record("push", f"push {patch.name}", {
        "patch": patch.name, "patch_commit": patch.commit, "base": patch.base, "health": None, "force": plan.force,
        **_broken_meta(plan), **({"hooks": {n: h.to_json() for n, h in hooks.items() if h}} if hooks else {})})
    ready = _ready(plan)
    units = unit_plans(plan.units, ready)
    rollout = Rollout(plan.units, allowed_failures(max_fail, len(units)))
    outcome = run_waves(store, ready, spec, record,
                        lambda wave: rollout.execute(store, wave, record, keep_going=keep_going, hooks=hooks,
                                                     pauses=pauses),
                        between, on_wave, units=units, tolerate=rollout.tolerates)
    result = WavesResult(plan, outcome.runs, rollout.budget, outcome.waves, outcome.finished, spec, why=outcome.why)
    if roll_back_finished is None:
        roll_back_finished = not keep_going
    if outcome.why in (FAILED, INTERRUPTED) and roll_back_finished:
        # In order, to the end: an interrupt's cut of busy connections must not reach these.
        with interrupt.deferred():
            result.rolled_back = roll_back_finished_waves(store, config, result, hooks, pauses)
    return result


def roll_back_finished_waves(store: Store, config: Config, result: WavesResult,
                             hooks: dict[str, Hooks] | None = None, pauses: Pauses | None = None) -> list[NodeRun]:
    """After a push in waves failed, undo it on the nodes of the waves that finished (each
    a real rollback: only the files the push wrote, each only while it still holds what was
    written; recorded; restarted by the hooks). A node that cannot be rolled back gets a
    failed run saying why; one already restored needs nothing and gets a ``done`` run with
    no record."""
    undone = []
    finished = {node for wave in result.waves[:result.finished] for node in wave}
    for run in result.nodes:
        if run.node not in finished or run.state != "done":
            continue
        try:
            with plan_rollback(store, config, run.node) as plan:
                done = apply_rollback(store, plan, hooks, after_interrupt=interrupt.requested(), pauses=pauses)
        except SnapverError as exc:
            done = NodeRun(run.node, "failed", error=exc)
        undone.append(done if done is not None else NodeRun(run.node, "done"))
    return undone
