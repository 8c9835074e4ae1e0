"""control_persist: successive commands share one SSH connection, and never fail because of it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from snapver.config import load_config
from snapver.transport.mux import spec_socket_path


def _mux_pids(sock: Path) -> set[int]:
    """The background processes serving ``sock`` (not other engineers' on this machine)."""
    out = subprocess.run(["pgrep", "-f", f"snapver.transport.mux {sock} "], capture_output=True, text=True).stdout
    return {int(pid) for pid in out.split()}


@pytest.fixture
def muxed_node(sshd, make_site_packages, write_config, ssh_node, tmp_path):
    """(key file, mux socket) of ct200 with control_persist; a key of its own makes the socket this test's."""
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "x = 1\n"})
    key = tmp_path / "key"
    shutil.copy(sshd.identity_file, key)
    os.chmod(key, 0o600)
    config = write_config({"ct200": ssh_node("ct200", site, identity_file=str(key), control_persist=30)})
    sock = spec_socket_path(load_config(str(config)).nodes["ct200"])
    yield key, sock
    for pid in _mux_pids(sock):
        os.kill(pid, signal.SIGTERM)


def test_second_command_reuses_the_held_connection(muxed_node, run_snapver):
    key, sock = muxed_node
    assert not _mux_pids(sock)
    first = run_snapver("pull", "ct200")
    assert first.code == 0, first
    started = _mux_pids(sock)
    assert len(started) == 1, "the first command starts one background connection"
    # Without the key, only the held connection can still reach the node.
    key.unlink()
    second = run_snapver("nodes", "--check")
    assert second.code == 0, second
    assert "yes" in second.out
    assert _mux_pids(sock) == started


def test_a_dead_persistent_connection_falls_back_to_a_direct_one(muxed_node, run_snapver):
    _key, sock = muxed_node
    assert run_snapver("nodes", "--check").code == 0
    assert _mux_pids(sock)
    for pid in _mux_pids(sock):
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    again = run_snapver("pull", "ct200")
    assert again.code == 0, again
    assert "snapshot" in again.out


def test_errors_still_reach_the_user_through_the_mux(sshd, make_site_packages, write_config, ssh_node,
                                                      run_snapver, tmp_path):
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "x = 1\n"})
    empty_known_hosts = tmp_path / "known_hosts"
    empty_known_hosts.write_text("")
    write_config({"ct200": ssh_node("ct200", site, known_hosts=str(empty_known_hosts), control_persist=30)})
    result = run_snapver("pull", "ct200")
    assert result.code == 3, result
    assert "not known" in result.err and "Traceback" not in result.err
