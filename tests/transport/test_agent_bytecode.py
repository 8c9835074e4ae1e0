"""The agent runs as the client's bytecode on a node whose Python has the same bytecode
magic (no compile of its 67 kB of source per connection), and from source anywhere else:
another magic, a bytecode part that does not load, or none at all. Over a real sshd."""

from __future__ import annotations

import marshal
import sys
import zlib
from pathlib import Path

import pytest
from helpers import toml_dumps

from snapver.config import load_config
from snapver.transport import base
from snapver.transport.agent import assemble
from snapver.transport.connect import open_transport

FILES = {"sglang/srt/a.py": "a = 1\n"}


def loaded_as(config: Path) -> str:
    """How the agent of a fresh connection to ct200 was loaded (its hello's ``loaded``),
    after a listing it must serve either way."""
    with open_transport(load_config(str(config)).node("ct200")) as transport:
        listed = transport.list_tree()
        assert [e.path for e in listed.entries] == ["sglang/srt/a.py"]
        return transport.call("hello", paths=["sglang/srt"])["loaded"]


@pytest.fixture
def node_config(sshd, make_site_packages, ssh_node, tmp_path: Path) -> Path:
    site = make_site_packages("ct200", files=FILES)
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": str(tmp_path / "store")},
                                  "nodes": {"ct200": ssh_node("ct200", site)}}))
    return config


def test_same_magic_runs_the_bytecode_and_anything_else_the_source(node_config: Path, monkeypatch) -> None:
    source = zlib.compress(assemble(), 6)

    def sending(bytecode: bytes) -> None:
        monkeypatch.setattr(base, "agent_payload", lambda: (source, bytecode))

    sending(zlib.compress(marshal.dumps(compile(assemble(), "snapver-agent", "exec")), 1))
    assert loaded_as(node_config) == "bytecode"
    monkeypatch.setattr(base, "MAGIC_NUMBER", b"\x00\x00\r\n")  # a node with another Python
    assert loaded_as(node_config) == "source"
    monkeypatch.undo()
    sending(zlib.compress(b"not marshal data", 1))
    assert loaded_as(node_config) == "source"
    sending(b"")  # no .pyc on the client
    assert loaded_as(node_config) == "source"


def test_the_bytecode_is_the_fresh_pyc_of_the_agent_and_never_a_stale_one(tmp_path: Path, monkeypatch) -> None:
    cached = tmp_path / "__pycache__" / "snapver_agent.pyc"
    monkeypatch.setattr(base, "_bytecode_path", lambda: cached)
    # Written even under PYTHONDONTWRITEBYTECODE: no install step makes it, and without it
    # every command would compile the agent again.
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    base._compiled_agent()  # as the first command that connects makes it
    code = marshal.loads(base._agent_bytecode())
    assert code.co_filename == "snapver-agent" and "op_hello" in code.co_names
    # A .pyc of another source (here: its recorded source hash no longer matches) is not sent.
    data = bytearray(cached.read_bytes())
    data[12:16] = (int.from_bytes(data[12:16], "little") + 1).to_bytes(4, "little")
    stale = tmp_path / "stale.pyc"
    stale.write_bytes(bytes(data))
    monkeypatch.setattr(base, "_bytecode_path", lambda: stale)
    assert base._agent_bytecode() == b""
