"""Canary waves, shared by push and rollback: the targets are split into waves (``1,25%,100%``:
cumulative node counts or percentages), and each wave is written, restarted and
health-checked before the next begins. A wave with a node that did not finish stops the
rollout: the nodes of later waves are never written, and each gets a "cancelled" record
saying after how many waves it stopped (what `status` shows). Every way out of the loop
ends so: a failed wave, a wave that could not start (a node lost while it waited), an
interrupt (during a wave or the pause before one), or a "no" between waves; the outcome
says which (``why``), for the caller to undo the finished waves by one rule.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from snapver import interrupt
from snapver.config import parse_waves
from snapver.errors import SnapverError, TransportError, UsageError
from snapver.ops.ledger import Record, write_records
from snapver.ops.nodeio import open_node
from snapver.ops.plan import MAX_PARALLEL, NodePlan
from snapver.ops.run import NodeRun
from snapver.store import refs
from snapver.store.repo import Store

__all__ = ["WavesOutcome", "split_waves", "run_waves", "FAILED", "INTERRUPTED", "DECLINED"]

# Why a rollout stopped: a node failed (or a wave could not start), an interrupt, a "no" between waves.
FAILED, INTERRUPTED, DECLINED = "failed", "interrupted", "declined"

Item = TypeVar("Item")


def split_waves(nodes: list[Item], steps: list[tuple[float, bool]]) -> list[list[Item]]:
    """The nodes (or units) of each wave, in order: wave k holds the nodes up to its cumulative size
    (a percentage rounded up); sizes that add no node are dropped, and whatever the last
    size leaves out forms a last wave (a rollout never stops short by its spec)."""
    total, done = len(nodes), 0
    waves: list[list[Item]] = []
    for value, percent in steps:
        upto = min(total, math.ceil(total * value / 100) if percent else int(value))
        if upto < done:
            raise UsageError(f"--waves: each wave must reach at least as many nodes as the one before "
                             f"({upto} after {done} of {total})")
        if upto > done:
            waves.append(nodes[done:upto])
            done = upto
    if done < total:
        waves.append(nodes[done:])
    return waves


@dataclass
class WavesOutcome:
    """Where a rollout in waves got to: ``finished`` of ``waves`` (node names per wave),
    and every node's run (``cancelled`` for those of waves never started); ``why`` it
    stopped (None: it did not)."""

    spec: str
    waves: list[list[str]] = field(default_factory=list)
    finished: int = 0
    runs: list[NodeRun] = field(default_factory=list)
    why: str | None = None

    @property
    def stopped(self) -> bool:
        return self.finished < len(self.waves)

    def to_json(self) -> dict[str, Any]:
        return {"waves": self.waves, "waves_finished": self.finished, "waves_spec": self.spec,
                "stopped": self.stopped, "stop_reason": self.why}


def run_waves(store: Store, nodes: list[NodePlan], spec: str, record: Record,
              run_wave: Callable[[list[NodePlan]], list[NodeRun]],
              between: Callable[[int, list[str]], bool] | None = None,
              on_wave: Callable[[int, list[NodeRun]], None] | None = None,
              units: list[list[NodePlan]] | None = None,
              tolerate: Callable[[list[NodeRun]], bool] | None = None) -> WavesOutcome:
    """Run ``run_wave`` on each wave of ``nodes`` in turn (``spec`` as ``parse_waves``
    reads it). ``record.meta`` gets, per wave, ``waves``, ``wave``, ``of_waves`` and
    ``waves_finished`` on top of what it holds. A wave with a run not ``done``, one that
    cannot start (its connections, dead since they were opened, cannot be opened again; or
    ``run_wave`` raises), an interrupt, or ``between(next_wave_index, its nodes)``
    answering False stops the rollout, and ``why`` says which. ``on_wave(index, runs)`` is
    told of each wave as it ends. The nodes never written get their "cancelled" records
    whichever way it stopped. ``units``: the nodes grouped as the waves count them (a
    serving group is one; default: each node); ``tolerate(runs)``: True when a wave's
    failures are within the push's failure budget, and the rollout goes on."""
    if units is None:
        waves = split_waves(nodes, parse_waves(spec))
    else:
        waves = [[plan for unit in wave for plan in unit] for wave in split_waves(units, parse_waves(spec))]
    outcome = WavesOutcome(spec, [[n.node for n in wave] for wave in waves])
    base_meta = dict(record.meta)
    for index, wave in enumerate(waves):
        began = False
        try:
            if index and between is not None and not between(index, [n.node for n in wave]):
                outcome.why = INTERRUPTED if interrupt.requested() else DECLINED
                break
            record.meta = {**base_meta, "waves": spec, "wave": index + 1, "of_waves": len(waves),
                           "waves_finished": index}
            began = True
            # The first wave's connections were opened for the plan just now; a first wave
            # that cannot start has written nothing anywhere, and raises.
            runs = _start_wave(store, wave, record, run_wave) if index else run_wave(wave)
        except KeyboardInterrupt:  # Ctrl-C in the pause, at the prompt, or outside the wave's writes
            outcome.why = INTERRUPTED
            if began:
                outcome.runs.extend(_not_started(store, plan.node, record, None) for plan in wave)
            break
        outcome.runs.extend(runs)
        if on_wave is not None:
            on_wave(index, runs)
        if interrupt.requested():
            outcome.why = INTERRUPTED
            break
        if any(run.state != "done" for run in runs) and not (tolerate is not None and tolerate(runs)):
            outcome.why = FAILED
            break
        outcome.finished = index + 1
    if outcome.stopped:
        outcome.why = outcome.why or FAILED
        _cancel_the_rest(store, [n for wave in waves for n in wave], outcome, record, base_meta)
    return outcome


def _start_wave(store: Store, wave: list[NodePlan], record: Record,
                run_wave: Callable[[list[NodePlan]], list[NodeRun]]) -> list[NodeRun]:
    """``run_wave(wave)`` once its nodes' connections, idle since the plan, answer again. A
    wave that cannot start is a failed wave: its nodes' runs say why (each ``cancelled``
    when it has no record of this push yet, else ``failed``)."""
    lost = reconnect(wave)
    if not lost:
        try:
            return run_wave(wave)
        except SnapverError as exc:
            lost = {plan.node: exc for plan in wave}
    return [_not_started(store, plan.node, record, lost.get(plan.node)) for plan in wave]


def _not_started(store: Store, node: str, record: Record, error: SnapverError | None) -> NodeRun:
    head = store.ref(refs.push_ref(node))
    if head is not None and store.commit(head).meta.get("push_id") == record.push_id:
        # A record of this push says "started": the node may be written; `rollback` repairs it.
        return NodeRun(node, "failed", record=head, error=error)
    return NodeRun(node, "cancelled", error=error)


def reconnect(plans: list[NodePlan]) -> dict[str, SnapverError]:
    """Check that each plan's connection still answers, and open again those that died while
    idle (a long pause between waves: an sshd session ended, a middlebox forgot the flow).
    Returns, by node, why one could not be opened again."""
    def one(plan: NodePlan) -> SnapverError | None:
        try:
            if plan.transport is not None and plan.transport.is_open:
                try:
                    plan.transport.ping()
                    return None
                except TransportError:
                    pass  # dead: a fresh connection below
            plan.close()
            plan.transport = open_node(plan.spec)
        except SnapverError as exc:
            plan.close()
            return exc
        return None

    if not plans:
        return {}
    with ThreadPoolExecutor(min(MAX_PARALLEL, len(plans))) as pool:
        found = dict(zip((plan.node for plan in plans), pool.map(one, plans), strict=False))
    return {node: error for node, error in found.items() if error is not None}


def _cancel_the_rest(store: Store, nodes: list[NodePlan], outcome: WavesOutcome, record: Record,
                     base_meta: dict[str, Any]) -> None:
    """Record, for each node the stopped rollout never wrote, that it was not written: those
    of later waves, and those of a wave that could not start (with why)."""
    runs = {run.node: run for run in outcome.runs}
    cancelled = []
    for node in nodes:
        run = runs.get(node.node)
        if run is None:
            run = NodeRun(node.node, "cancelled")
            outcome.runs.append(run)
        elif run.state != "cancelled" or run.record is not None:
            continue
        cancelled.append(run)
    if not cancelled:
        return
    stopped = (f"not written: the {record.action} stopped after {outcome.finished} of {len(outcome.waves)} "
               f"wave(s)" + (" (interrupted)" if outcome.why == INTERRUPTED else ""))
    rows = []
    for run in cancelled:
        head = store.ref(refs.node_ref(run.node))
        run.before = run.after = head
        rows.append({"node": run.node, "state": "cancelled", "tree": head, "before": head, "after": head,
                     "written": 0, "deleted": 0, "waves": outcome.spec, "of_waves": len(outcome.waves),
                     "waves_finished": outcome.finished, "interrupted": outcome.why == INTERRUPTED,
                     "error": f"{stopped}: {run.error}" if run.error is not None else stopped})
    record.meta = {**base_meta, "waves": outcome.spec, "of_waves": len(outcome.waves)}
    by_node = {run.node: run for run in cancelled}
    with store.lock():
        for name, commit in write_records(store, record, rows).items():
            by_node[name].record = commit
