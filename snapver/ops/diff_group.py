"""diff GROUP: each node of a group (or a node range) against its newest snapshot."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from snapver.config import Config
from snapver.noderange import is_range

if TYPE_CHECKING:  # the CLI asks `names_nodes` before the diff's modules load
    from snapver.ops.diff import DiffResult
    from snapver.store.repo import Store
    from snapver.transport.connect import Starting


@dataclass(frozen=True)
class GroupDiff:
    """One diff per node of ``group``, in the group's order."""

    group: str
    results: list[DiffResult]

    @property
    def exit_code(self) -> int:
        return max((result.exit_code for result in self.results), default=0)

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group,
                "nodes": [{"node": result.b.node, **result.to_json()} for result in self.results],
                "identical": self.exit_code == 0, "exit_code": self.exit_code}


def names_nodes(config: Config, text: str) -> bool:
    """True when ``text`` names several nodes at once: a group, or a node range."""
    return text in config.groups or (is_range(text) and text not in config.nodes)


def group_nodes(config: Config, text: str) -> list[str]:
    """The nodes a group or a node range names, in order."""
    return [spec.name for spec in config.select([text])]


def diff_group(store: Store | None, config: Config, group: str, paths: Sequence[str] = (),
               contents: bool = False, context: int = 3, checksum: bool = False,
               starting: Starting | None = None) -> GroupDiff:
    """Each node's live tree against its newest snapshot (as ``diff NODE``), node by node."""
    from snapver.ops.diff import diff

    results = [diff(store, config, node, None, paths, contents=contents, context=context, checksum=checksum,
                    starting=starting) for node in group_nodes(config, group)]
    return GroupDiff(group, results)
