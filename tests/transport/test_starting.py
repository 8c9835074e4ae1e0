"""``Starting``: nodes' connections begun while a command prepares, handed over or closed.

Real agents: a local node's agent is a child process of this one (its session of its
own), an SSH node's runs under the test sshd. Nothing is mocked.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest

from snapver.config import load_config
from snapver.errors import TransportError
from snapver.transport.connect import Starting


def _agents_of(pid: int) -> set[int]:
    """This process's children that are snapver agents (the local transport's ``sh -c``
    execs python with the bootstrap, whose text names the agent)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                parent = int(handle.read().rsplit(b")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read()
        except (OSError, IndexError, ValueError):
            continue
        if parent == pid and b"snapver-agent" in command:
            found.add(int(entry))
    return found


def _until(condition, seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return condition()


@pytest.fixture
def local_spec(make_site_packages, write_config):
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n"})
    return load_config(write_config({"n1": {"local": True, "site_packages": str(site)}})).node("n1")


def test_a_started_transport_is_handed_over_and_lists(local_spec) -> None:
    with Starting([local_spec]) as starting:
        assert starting.take("n2") is None  # none begun for it: the caller connects itself
        transport = starting.take("n1")
        assert transport is not None and starting.take("n1") is None  # handed over once
    try:  # taken: leaving the block did not close it
        assert transport.is_open
        assert [e.path for e in transport.list_tree(want_oids=False).entries] == ["sglang/srt/a.py"]
    finally:
        transport.close()
    assert _until(lambda: not _agents_of(os.getpid()))


@pytest.mark.parametrize("when", ["started", "still starting"])
def test_what_is_not_taken_is_closed(local_spec, when: str) -> None:
    """A command that fails before it uses a connection (a tag that exists, a store it
    cannot open) leaves no agent behind: one already started is closed on leaving, one
    still starting closes itself once started."""
    me = os.getpid()
    assert not _agents_of(me)
    with Starting([local_spec]):
        if when == "started":
            assert _until(lambda: bool(_agents_of(me)))
    assert _until(lambda: not _agents_of(me)), "an agent was left running"


def test_a_node_that_cannot_be_reached_fails_when_taken(write_config) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]  # nothing listens on it once closed
    spec = load_config(write_config({"gone": {"host": "127.0.0.1", "port": port, "connect_timeout": 2,
                                                       "site_packages": "/nowhere"}})).node("gone")
    with Starting([spec]) as starting:
        with pytest.raises(TransportError, match="gone"):
            starting.take("gone")


def test_an_ssh_node_is_connected_before_it_is_taken(sshd, ssh_node, make_site_packages, write_config) -> None:
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    spec = load_config(write_config({"ct200": ssh_node("ct200", site)})).node("ct200")
    with Starting([spec]) as starting:
        transport = starting.take("ct200")
    assert transport is not None
    with transport:
        assert transport.info is not None and Path(transport.info.site_packages) == site
        assert [e.path for e in transport.list_tree(want_oids=False).entries] == ["sglang/srt/a.py"]
