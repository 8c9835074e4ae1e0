"""env: the environment under the tree on every node, live, as a matrix of the items
(Python, distributions, torch's CUDA, GPU, driver, kernel) that are not the same on all.

Each node's agent reads it (``env`` op, ``transport/agent/environ.py``), in parallel; a
row's outliers are the nodes whose value is not the one most nodes have.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from snapver.config import NodeSpec
from snapver.environment import Environment, item_order, normalized
from snapver.errors import SnapverError
from snapver.ops.envrecord import live_environment

MAX_PARALLEL = 16


@dataclass
class NodeEnv:
    """One node's environment, or why it could not be read."""

    node: str
    environment: Environment | None = None
    error: SnapverError | None = None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "ok": self.error is None,
                "environment": self.environment.to_json() if self.environment else None,
                "error": str(self.error) if self.error else None}


@dataclass(frozen=True)
class EnvRow:
    """One item across the nodes read: each node's value (None: not there), and the outliers."""

    item: str
    values: dict[str, str | None]
    outliers: frozenset[str] = frozenset()

    @property
    def agrees(self) -> bool:
        return len(set(self.values.values())) <= 1

    def to_json(self) -> dict[str, Any]:
        return {"item": self.item, "values": self.values, "agrees": self.agrees, "outliers": sorted(self.outliers)}


@dataclass
class EnvResult:
    nodes: list[NodeEnv]
    rows: list[EnvRow] = field(default_factory=list)
    items: int = 0  # how many items were compared (rows are those shown)

    @property
    def compared(self) -> list[str]:
        return [n.node for n in self.nodes if n.environment is not None]

    @property
    def not_compared(self) -> list[str]:
        return [n.node for n in self.nodes if n.environment is None]

    @property
    def differ(self) -> int:
        return sum(1 for row in self.rows if not row.agrees)

    @property
    def exit_code(self) -> int:
        failed = [n.error.exit_code for n in self.nodes if n.error is not None]
        if failed:
            return max(failed)
        return 1 if self.differ else 0

    def to_json(self) -> dict[str, Any]:
        return {"nodes": [n.to_json() for n in self.nodes], "rows": [r.to_json() for r in self.rows],
                "items": self.items, "differ": self.differ, "compared": self.compared,
                "not_compared": self.not_compared, "exit_code": self.exit_code}


def read_environment(spec: NodeSpec) -> NodeEnv:
    """A node's environment, live (its error when it cannot be read)."""
    try:
        return NodeEnv(spec.name, live_environment(spec))
    except SnapverError as exc:
        return NodeEnv(spec.name, error=exc)


def outliers_of(values: dict[str, str | None]) -> frozenset[str]:
    """The nodes whose value is not the one most nodes have (none when no value has most)."""
    counts = Counter(values.values()).most_common()
    if len(counts) < 2 or counts[0][1] == counts[1][1]:
        return frozenset()
    return frozenset(node for node, value in values.items() if value != counts[0][0])


def matrix_rows(environments: dict[str, Environment]) -> list[EnvRow]:
    """Every item of any node, in order (facts, then distributions), with each node's value."""
    items = {node: env.items() for node, env in environments.items()}
    names = sorted({name for found in items.values() for name in found}, key=item_order)
    rows = []
    for name in names:
        values = {node: found.get(name) for node, found in items.items()}
        rows.append(EnvRow(name, values, outliers_of(values)))
    return rows


def selected(rows: Iterable[EnvRow], names: list[str]) -> list[EnvRow]:
    """The rows whose item matches one of ``names`` (fnmatch globs; a distribution's name
    as pip spells it or normalized, case aside)."""
    patterns = [pattern.lower() for pattern in names] + [normalized(pattern) for pattern in names]
    return [row for row in rows if any(fnmatch.fnmatchcase(row.item.lower(), p) for p in patterns)]


def env(specs: list[NodeSpec], all_rows: bool = False, names: list[str] | None = None) -> EnvResult:
    """The environment matrix of ``specs``: rows that differ, every row with ``all_rows``,
    the rows ``names`` select (agreeing or not) when given."""
    with ThreadPoolExecutor(max(1, min(MAX_PARALLEL, len(specs)))) as pool:
        nodes = list(pool.map(read_environment, specs))
    environments = {n.node: n.environment for n in nodes if n.environment is not None}
    rows = matrix_rows(environments)
    if names:
        rows = selected(rows, names)
    items = len(rows)
    if not all_rows and not names:
        rows = [row for row in rows if not row.agrees]
    return EnvResult(nodes, rows, items)

