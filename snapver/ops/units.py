"""The units of a rollout, and its failure budget.

A unit is what a wave counts and what fails as one: a node, or a serving group (nodes that
run one server together, ``[groups.NAME] serving = true``). A serving group is written
together, then restarted node by node in config order (a multi-node server comes up only
once every rank runs the same code), then health-checked; when any of its nodes fails (its
write, restart or health check) every node of it is rolled back and restarted on the
restored code. The failure budget (``--max-fail``) is how many units may fail, each rolled
back, while the rollout goes on.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from snapver import interrupt
from snapver.config import Config, parse_waves
from snapver.errors import Cancelled, SnapverError, TransportError, UsageError
from snapver.ops.hooks import Hooks, hooks_again, run_hooks
from snapver.ops.ledger import Record
from snapver.ops.plan import NodePlan
from snapver.ops.run import Execution, NodeRun, Pauses
from snapver.ops.waves import split_waves
from snapver.store.repo import Store

__all__ = ["Unit", "plan_units", "check_whole_groups", "unit_plans", "wave_units", "failed_units",
           "UnitExecution", "Rollout"]


@dataclass(frozen=True)
class Unit:
    """One unit of a rollout: a serving group (its nodes in config order) or one node."""

    name: str
    nodes: tuple[str, ...]
    serving: bool = False

    @property
    def label(self) -> str:
        """``dsv3 (ct210, ct211)`` for a serving group, the node's name for a node."""
        return f"{self.name} ({', '.join(self.nodes)})" if self.serving else self.name

    def to_json(self) -> dict[str, Any]:
        return {"unit": self.name, "nodes": list(self.nodes), "serving": self.serving}


def plan_units(config: Config, names: list[str]) -> list[Unit]:
    """The units of a push to the nodes ``names`` (in order): a serving group whole, at the
    place of its first node named; every other node alone."""
    group_of = {node: group for group, members in config.serving.items() for node in members}
    units: list[Unit] = []
    seen: set[str] = set()
    for name in names:
        group = group_of.get(name)
        if group is None:
            units.append(Unit(name, (name,)))
        elif group not in seen:
            seen.add(group)
            units.append(Unit(group, config.serving[group], serving=True))
    return units


def check_whole_groups(config: Config, names: list[str], patch: str) -> None:
    """Refuse targets that name only part of a serving group: patching and restarting half
    of one server breaks all of it."""
    chosen = set(names)
    for group, members in config.serving.items():
        missing = [node for node in members if node not in chosen]
        if missing and len(missing) < len(members):
            raise UsageError(f"the targets name only part of serving group {group!r}: {', '.join(missing)} "
                             f"missing (its nodes {', '.join(members)} run one server and are pushed together)",
                             hint=f"name the group: `snapver push {patch} {group}`")


def unit_plans(units: list[Unit], plans: list[NodePlan]) -> list[list[NodePlan]]:
    """``plans`` grouped by unit (in the units' order, a group's in config order); a unit
    none of whose nodes is in ``plans`` is left out."""
    by_name = {plan.node: plan for plan in plans}
    grouped = [[by_name[node] for node in unit.nodes if node in by_name] for unit in units]
    return [members for members in grouped if members]


def wave_units(units: list[Unit], plans: list[NodePlan], spec: str | None) -> list[list[Unit]]:
    """The units of each wave (``spec`` as ``--waves`` reads it; None: one wave), counting
    a unit once whatever its size; only the units with a node in ``plans``."""
    busy = {plan.node for plan in plans}
    present = [unit for unit in units if busy & set(unit.nodes)]
    return split_waves(present, parse_waves(spec)) if spec else [present] if present else []


def failed_units(units: list[Unit], runs: list[NodeRun]) -> list[Unit]:
    """The units with a node that failed (its write, restart or health check; a node lost
    before its wave); a node stopped by an interrupt or by another unit's failure is not one."""
    failed = {run.node for run in runs if run.error is not None and not isinstance(run.error, Cancelled)}
    return [unit for unit in units if failed & set(unit.nodes)]


@dataclass
class UnitExecution(Execution):
    """An ``Execution`` by units: a serving group as one task (write all, restart in order,
    health-check, undo all on any failure) and a failure budget: ``budget`` units may fail
    (each undone) before the nodes not yet started stop and the written ones are undone."""

    units: list[Unit] = field(default_factory=list)
    budget: int = 0
    failed: dict[str, None] = field(default_factory=dict)  # the units failed in this run
    group_hooks: dict[str, Hooks] = field(init=False)  # a serving group's nodes' hooks, run by the group
    unit_of: dict[str, Unit] = field(init=False)
    guard: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        super().__post_init__()
        covered = {node for unit in self.units for node in unit.nodes}
        self.units = self.units + [Unit(p.node, (p.node,)) for p in self.plans if p.node not in covered]
        self.unit_of = {node: unit for unit in self.units for node in unit.nodes}
        serving = {node for unit in self.units if unit.serving for node in unit.nodes}
        hooks = self.hooks or {}
        self.group_hooks = {node: h for node, h in hooks.items() if node in serving}
        self.hooks = {node: h for node, h in hooks.items() if node not in serving}

    def tasks(self) -> list[tuple[Callable[[], None], list[NodePlan]]]:
        found: list[tuple[Callable[[], None], list[NodePlan]]] = []
        for unit, plans in zip(self.units, self._members(), strict=True):
            if plans:
                task = functools.partial(self.apply_group, unit, plans) if unit.serving else \
                    functools.partial(self.apply, plans[0])
                found.append((task, plans))
        return found

    def _members(self) -> list[list[NodePlan]]:
        by_name = {plan.node: plan for plan in self.plans}
        return [[by_name[node] for node in unit.nodes if node in by_name] for unit in self.units]

    def node_failed(self, plan: NodePlan) -> None:
        with self.guard:
            self.failed[self.unit_of[plan.node].name] = None
            if len(self.failed) > self.budget:
                self.stop.set()

    def apply_group(self, unit: Unit, plans: list[NodePlan]) -> None:
        """Write every node of a serving group, then restart them in order and check them;
        any failure undoes them all."""
        if (self.stop.is_set() and not self.keep_going) or (interrupt.requested() and not self.after_interrupt):
            return
        with ThreadPoolExecutor(len(plans)) as pool:
            list(pool.map(self.apply, plans))  # writes only: the group's hooks are not the node's
        runs = [self.runs[plan.node] for plan in plans]
        if all(run.state == "done" for run in runs):
            failure = self._restart_group(plans)
            if failure is None:
                return
            plan, error = failure
            self.runs[plan.node].error, self.runs[plan.node].state = error, "failed"
            self.node_failed(plan)
        culprit = next((run for run in runs if run.state == "failed"), None)
        if culprit is None or not self.undo_failed or interrupt.requested():
            return  # stopped by another unit or an interrupt: the run undoes what is written
        for run in runs:
            if run is not culprit and run.error is None and run.state == "done":
                run.error = TransportError(f"{run.node}: rolled back with serving group {unit.name} "
                                           f"({culprit.node} failed)")
        self.undo_group(plans)

    def _restart_group(self, plans: list[NodePlan]) -> tuple[NodePlan, SnapverError] | None:
        """Restart every node in config order, then check each; the first failure, if any."""
        for restarting in (True, False):
            for plan in plans:
                step = _phase(self.group_hooks.get(plan.node), restarting)
                if step is None or plan.transport is None:
                    continue
                run = self.runs[plan.node]
                run.hooks_started = run.hooks_started or restarting
                try:
                    run_hooks(plan.transport, plan.spec, step, run.hooks_log)
                except SnapverError as exc:
                    return plan, exc
        return None

    def undo_group(self, plans: list[NodePlan]) -> None:
        """Undo every written node of a serving group, then restart them all in order on the
        restored code and check them, if any was restarted on the new."""
        for plan in plans:
            if plan.node not in self.undone and self.runs[plan.node].state in ("done", "failed"):
                self.undo(plan)
        if interrupt.requested() or not any(self.runs[plan.node].hooks_started for plan in plans):
            return
        for restarting in (True, False):
            for plan in plans:
                run, step = self.runs[plan.node], _phase(self.group_hooks.get(plan.node), restarting)
                if step is not None and run.recovery_error is None:
                    run.recovery_error = hooks_again(plan, step, run.recovery_log)

    def undo_all(self, pool: ThreadPoolExecutor, plans: list[NodePlan]) -> None:
        undoing = {plan.node for plan in plans}
        jobs = []
        for unit, members in zip(self.units, self._members(), strict=True):
            if not undoing & {plan.node for plan in members}:
                continue
            jobs.append(functools.partial(self.undo_group, members) if unit.serving else
                        functools.partial(self.undo, members[0]))
        list(pool.map(lambda job: job(), jobs))


def _phase(hooks: Hooks | None, restarting: bool) -> Hooks | None:
    """One phase of a node's hooks in a serving group: its restart, or its health checks
    (None: nothing to run in that phase)."""
    if hooks is None:
        return None
    step = Hooks(restart=hooks.restart, timeout=hooks.timeout) if restarting else \
        dataclasses.replace(hooks, restart=None)
    return step if step else None


@dataclass
class Rollout:
    """A push's units and its failure budget (``budget`` units may fail in all), with the
    units failed so far, across its waves."""

    units: list[Unit]
    budget: int = 0
    failed: list[Unit] = field(default_factory=list)

    def execute(self, store: Store, plans: list[NodePlan], record: Record, *, keep_going: bool = False,
                hooks: dict[str, Hooks] | None = None, pauses: Pauses | None = None, health: str | None = None,
                health_timeout: float = 300.0) -> list[NodeRun]:
        """Apply ``plans`` (those with writes) by units, with what is left of the budget."""
        busy = [plan for plan in plans if plan.writes]
        if not busy:
            return []
        mine = [unit for unit in self.units if {plan.node for plan in busy} & set(unit.nodes)]
        runs = UnitExecution(store, busy, record, health, health_timeout, keep_going, hooks=hooks,
                             pauses=pauses or Pauses(), units=mine, budget=self.budget - len(self.failed)).run()
        self.tolerates(runs)
        return runs

    def tolerates(self, runs: list[NodeRun]) -> bool:
        """Count the units of ``runs`` that failed; True while the failed units are within the budget."""
        for unit in failed_units(self.units, runs):
            if unit not in self.failed:
                self.failed.append(unit)
        return len(self.failed) <= self.budget
