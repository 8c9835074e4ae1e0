"""Rollback: restore a node's tracked tree exactly to a snapshot (content, mode, links,
deletions, additions) — by default to how it was before the last push that changed it,
which also repairs a push that was killed half-way. Same plan/apply path as push."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from snapver.config import Config
from snapver.errors import RefError, SnapverError
from snapver.model import Entry
from snapver.ops.plan import Live, NodePlan, NodeRun, PushState, Record, execute, last_push, newest_record, \
    open_node, restore_steps, within, write_records
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

    @property
    def nothing_to_do(self) -> bool:
        return not self.node.writes

    def close(self) -> None:
        self.node.close()

    def __enter__(self) -> "RollbackPlan":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node.node, "target": self.target, "reason": self.reason,
                "interrupted": self.interrupted.to_json() if self.interrupted else None,
                "nothing_to_do": self.nothing_to_do, "plan": self.node.to_json()}


def default_target(store: Store, node: str) -> tuple[str, str]:
    """The snapshot from before the node's last push (or interrupted push), and why."""
    pushed = last_push(store, node)
    if pushed is None or not pushed.restore:
        raise RefError(f"no push to {node} is recorded, so there is nothing to roll back to",
                       hint=f"name a snapshot: `snapver rollback {node} --to REF`")
    how = "interrupted push" if pushed.state == "started" else "push"
    return pushed.restore, f"before the {how} of {pushed.patch} ({pushed.time:%Y-%m-%d %H:%M})"


def plan_rollback(store: Store, config: Config, node: str, to: str | None = None) -> RollbackPlan:
    """List the node and plan what makes it exactly the target snapshot."""
    from snapver.ops.pull import list_live

    spec = config.node(node)
    if to is None:
        target, reason = default_target(store, spec.name)
    else:
        target, reason = resolve_snapshot(store, config, to), f"--to {to}"
    manifest = store.manifest(target)
    wanted: dict[str, Entry | None] = {e.path: e for e in manifest if within(e.path, spec.paths)}
    prior = newest_record(store, spec.name)
    plan = RollbackPlan(NodePlan(spec), target, reason, prior if prior and prior.interrupted else None,
                        len(manifest) - len(wanted))
    try:
        plan.node.transport = open_node(spec)
        listing = list_live(store, plan.node.transport)
    except SnapverError:
        plan.close()
        raise
    live = {e.path: Live(e.kind, e.oid, e.mode) for e in listing.entries}
    plan.node.steps = restore_steps(live, wanted)
    if plan.ignored:
        plan.node.notes.append(f"{plan.ignored} path(s) of {target[:10]} lie outside the node's tracked paths "
                               f"({', '.join(spec.paths)}) and are left alone")
    return plan


def apply_rollback(store: Store, plan: RollbackPlan) -> NodeRun | None:
    """Write the plan; with nothing to write, only close an interrupted push's record."""
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
    runs = execute(store, [plan.node], record, undo_failed=False)
    return runs[0]
