"""Canary waves, shared by push and rollback: the targets are split into waves (``1,25%,100%``:
cumulative node counts or percentages), and each wave is written, restarted and
health-checked before the next begins. A wave with a node that did not finish stops the
rollout: the nodes of later waves are never written, and each gets a "cancelled" record
saying after how many waves it stopped (what `status` shows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

from snapver import interrupt
from snapver.config import parse_waves
from snapver.errors import UsageError
from snapver.ops.plan import NodePlan, NodeRun, Record, write_records
from snapver.store import refs
from snapver.store.repo import Store

__all__ = ["WavesOutcome", "split_waves", "run_waves"]


def split_waves(nodes: list[NodePlan], steps: list[tuple[float, bool]]) -> list[list[NodePlan]]:
    """The nodes of each wave, in order: wave k holds the nodes up to its cumulative size
    (a percentage rounded up); sizes that add no node are dropped, and whatever the last
    size leaves out forms a last wave (a rollout never stops short by its spec)."""
    total, waves, done = len(nodes), [], 0
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
    and every node's run (``cancelled`` for those of waves never started)."""

    spec: str
    waves: list[list[str]] = field(default_factory=list)
    finished: int = 0
    runs: list[NodeRun] = field(default_factory=list)

    @property
    def stopped(self) -> bool:
        return self.finished < len(self.waves)

    def to_json(self) -> dict[str, Any]:
        return {"waves": self.waves, "waves_finished": self.finished, "waves_spec": self.spec,
                "stopped": self.stopped}


def run_waves(store: Store, nodes: list[NodePlan], spec: str, record: Record,
              run_wave: Callable[[list[NodePlan]], list[NodeRun]],
              between: Callable[[int, list[str]], bool] | None = None,
              on_wave: Callable[[int, list[NodeRun]], None] | None = None) -> WavesOutcome:
    """Run ``run_wave`` on each wave of ``nodes`` in turn (``spec`` as ``parse_waves``
    reads it). ``record.meta`` gets, per wave, ``waves``, ``wave``, ``of_waves`` and
    ``waves_finished`` on top of what it holds. A wave with a run not ``done`` (or an
    interrupt) stops the rollout; so does ``between(next_wave_index, its nodes)``
    answering False. ``on_wave(index, runs)`` is told of each wave as it ends."""
    waves = split_waves(nodes, parse_waves(spec))
    outcome = WavesOutcome(spec, [[n.node for n in wave] for wave in waves])
    base_meta = dict(record.meta)
    for index, wave in enumerate(waves):
        if index and between is not None and not between(index, [n.node for n in wave]):
            break
        record.meta = {**base_meta, "waves": spec, "wave": index + 1, "of_waves": len(waves),
                       "waves_finished": index}
        runs = run_wave(wave)
        outcome.runs.extend(runs)
        if on_wave is not None:
            on_wave(index, runs)
        if any(run.state != "done" for run in runs) or interrupt.requested():
            break
        outcome.finished = index + 1
    if outcome.stopped:
        _cancel_the_rest(store, [n for wave in waves for n in wave], outcome, record, base_meta)
    return outcome


def _cancel_the_rest(store: Store, nodes: list[NodePlan], outcome: WavesOutcome, record: Record,
                     base_meta: dict[str, Any]) -> None:
    """Record, for each node the stopped rollout never reached, that it was not written."""
    reached = {run.node for run in outcome.runs}
    rows = []
    for node in nodes:
        if node.node in reached:
            continue
        head = store.ref(refs.node_ref(node.node))
        rows.append({"node": node.node, "state": "cancelled", "tree": head, "before": head, "after": head,
                     "written": 0, "deleted": 0, "waves": outcome.spec, "of_waves": len(outcome.waves),
                     "waves_finished": outcome.finished,
                     "error": f"not written: the {record.action} stopped after {outcome.finished} of "
                              f"{len(outcome.waves)} wave(s)"})
        outcome.runs.append(NodeRun(node.node, "cancelled", head, head))
    if rows:
        record.meta = {**base_meta, "waves": outcome.spec, "of_waves": len(outcome.waves)}
        with store.lock():
            for name, commit in write_records(store, record, rows).items():
                next(run for run in outcome.runs if run.node == name).record = commit
