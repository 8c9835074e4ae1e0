"""The transport layer's shape: the protocol (base.py) below its implementations.

``open_transport`` lives in ``transport/connect.py``, the one module that names the
implementations; ``base.py`` imports none of them (it used to, inside ``open_transport``:
base → local/mux/ssh/early → base, a four-file circle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import snapver.transport.base as base
from snapver.config import load_config
from snapver.transport.connect import open_transport
from snapver.transport.local import LocalTransport

IMPLEMENTATIONS = {"snapver.transport.local", "snapver.transport.mux", "snapver.transport.ssh",
                   "snapver.transport.early", "snapver.transport.connect"}


def imported_modules(path: Path) -> set[str]:
    """Every module a source file imports, at any depth (function-level imports too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_protocol_imports_no_implementation() -> None:
    assert imported_modules(Path(base.__file__)) & IMPLEMENTATIONS == set()
    assert not hasattr(base, "open_transport")
    for name in ("local", "mux", "ssh"):
        assert "snapver.transport.base" in imported_modules(Path(base.__file__).with_name(f"{name}.py"))


def test_open_transport_builds_a_local_node(make_site_packages, write_config) -> None:
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n"})
    config = load_config(write_config({"n1": {"local": True, "site_packages": str(site)}}))
    with open_transport(config.node("n1")) as transport:
        assert isinstance(transport, LocalTransport)
        assert [entry.path for entry in transport.list_tree(want_oids=False).entries] == ["sglang/srt/a.py"]
