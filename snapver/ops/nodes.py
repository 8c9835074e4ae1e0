"""nodes: list what the config names, and with --check, reach each node."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from snapver.config import Config, NodeSpec
from snapver.errors import SnapverError
from snapver.transport.connect import open_transport


@dataclass(frozen=True)
class NodeCheck:
    node: str
    address: str
    reachable: bool | None = None  # None: not checked
    python: str = ""
    site_packages: str = ""
    dists: str = ""
    error: str = ""
    exit_code: int = 0

    def to_json(self) -> dict:
        return self.__dict__.copy()


def check_node(spec: NodeSpec) -> NodeCheck:
    """Reach the node, start its agent, list its tracked paths; each found fact is reported
    even when a later step fails (a node that answers is reachable, its python missing or not)."""
    transport = None
    found: dict[str, str] = {"site_packages": spec.site_packages or ""}
    try:
        transport = open_transport(spec)
        with transport:
            info = transport.info
            assert info is not None
            transport.list_tree(want_oids=False)  # the tracked paths exist and are readable
            return NodeCheck(spec.name, spec.address, True, python=f"{info.python_version} ({info.python})",
                             site_packages=info.site_packages, dists=info.dist_summary())
    except SnapverError as exc:
        reached = transport is not None and transport.reached
        return NodeCheck(spec.name, spec.address, reached, **found, error=str(exc), exit_code=exc.exit_code)


def list_nodes(config: Config, check: bool = False) -> list[NodeCheck]:
    specs = list(config.nodes.values())
    if not check:
        return [NodeCheck(s.name, s.address, None, site_packages=s.site_packages or "") for s in specs]
    with ThreadPoolExecutor(max(1, min(32, len(specs)))) as pool:
        return list(pool.map(check_node, specs))
