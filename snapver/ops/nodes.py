"""nodes: list what the config names, and with --check, reach each node."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from snapver.config import Config, NodeSpec
from snapver.errors import SnapverError
from snapver.ops.sourcetree import from_checkout, install_line, request_head
from snapver.transport.connect import open_transport


@dataclass(frozen=True)
class NodeCheck:
    node: str
    address: str
    reachable: bool | None = None  # None: not checked
    python: str = ""
    site_packages: str = ""
    dists: str = ""  # the distribution and version; an editable install's checkout and its HEAD
    install: dict[str, Any] | None = None  # what the node's Python found (kind, root, how it was found)
    error: str = ""
    exit_code: int = 0

    def to_json(self) -> dict:
        return self.__dict__.copy()


def check_node(spec: NodeSpec) -> NodeCheck:
    """Reach the node, start its agent, list its tracked paths; each found fact is reported
    even when a later step fails (a node that answers is reachable, its python missing or not)."""
    transport = None
    found: dict[str, Any] = {"site_packages": spec.site_packages or ""}
    try:
        transport = open_transport(spec)
        with transport:
            info = transport.info
            assert info is not None
            head = request_head(transport) if from_checkout(info) else None
            committed = head() if head is not None else None
            transport.list_tree(want_oids=False)  # the tracked paths exist and are readable
            return NodeCheck(spec.name, spec.address, True, python=f"{info.python_version} ({info.python})",
                             site_packages=info.site_packages, dists=install_line(info, committed),
                             install=info.install.to_json() if info.install else None)
    except SnapverError as exc:
        reached = transport is not None and transport.reached
        return NodeCheck(spec.name, spec.address, reached, **found, error=str(exc), exit_code=exc.exit_code)


def list_nodes(config: Config, check: bool = False) -> list[NodeCheck]:
    specs = list(config.nodes.values())
    if not check:
        return [NodeCheck(s.name, s.address, None, site_packages=s.site_packages or "") for s in specs]
    with ThreadPoolExecutor(max(1, min(32, len(specs)))) as pool:
        return list(pool.map(check_node, specs))
