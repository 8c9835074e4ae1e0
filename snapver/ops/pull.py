"""pull: snapshot nodes into the store under its lock (the engine is ``ops/snapshot.py``),
then start a background repack when enough raw bytes piled up."""

from __future__ import annotations

from collections.abc import Callable

from snapver.config import NodeSpec
from snapver.ops.snapshot import NodePull, ProgressFn, PullResult, pull_locked
from snapver.store.gc import maybe_compact
from snapver.store.repo import Store
from snapver.transport.connect import Starting


def pull(store: Store, specs: list[NodeSpec], tag: str | None = None, message: str = "",
         on_plan: Callable[[int, int], None] | None = None, on_progress: ProgressFn | None = None,
         on_node_done: Callable[[NodePull], None] | None = None, starting: Starting | None = None) -> PullResult:
    """Snapshot every node in ``specs`` (in parallel), holding the store lock. Never changes a node.

    ``starting``: the nodes' connections, begun by the caller before it got here."""
    with store.lock():
        result = pull_locked(store, specs, tag, message, on_plan, on_progress, on_node_done, starting=starting)
    result.compacting = maybe_compact(store.path)
    return result
