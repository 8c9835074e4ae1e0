"""Two commands on one store: the lock makes the second wait briefly, then fail (exit 4);
a holder killed with SIGKILL frees it at once (flock dies with its process).

The holder is a real `snapver pull` held inside the lock by a node whose ``python``
sleeps before it starts the agent.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
from faultkit import all_refs, assert_store_sound, start_snapver, wait_for

SRT = "sglang/srt"
HOLD_SECONDS = 4


@pytest.fixture
def two_nodes(small_site, make_site_packages, local_node, write_config, run_snapver, tmp_path, store):
    """Node ``slow`` (its python sleeps before the agent runs) and node ``fast``; one snapshot each."""
    fast_site = make_site_packages("fast", files={f"{SRT}/f.py": "f = 1\n"})
    sleepy = tmp_path / "sleepy-python"
    sleepy.write_text(f"#!/bin/sh\n[ -e {tmp_path}/slow ] && sleep {HOLD_SECONDS}\nexec {sys.executable} \"$@\"\n")
    sleepy.chmod(0o755)
    write_config({"slow": local_node(small_site, python=str(sleepy)), "fast": local_node(fast_site)})
    result = run_snapver("pull", "--all")
    assert result.code == 0, str(result)
    (tmp_path / "slow").touch()  # from now on, pulling `slow` holds the lock for HOLD_SECONDS
    (small_site / SRT / "server_args.py").write_text("port = 30001\n")
    (fast_site / SRT / "f.py").write_text("f = 2\n")
    return small_site, fast_site


def holding(store: Path, pid: int) -> bool:
    """True once process ``pid`` has taken the store lock (it writes its pid into the lock file)."""
    try:
        return (store / "snapver.lock").read_text().strip() == str(pid)
    except OSError:
        return False


def test_second_writer_waits_then_exits_4_and_readers_carry_on(two_nodes, run_snapver, store) -> None:
    before = all_refs(store)
    holder = start_snapver("pull", "slow")
    try:
        wait_for(lambda: holding(store, holder.pid), 20, "the first pull to take the lock")
        for command in (["pull", "fast"], ["tag", "during", "fast"]):
            began = time.monotonic()
            result = run_snapver(*command, env={"SNAPVER_LOCK_WAIT": "1"})
            waited = time.monotonic() - began
            assert result.code == 4, str(result)
            assert "locked" in result.err and str(holder.pid) in result.err, result.err
            assert "Traceback" not in result.err and len(result.err.strip().splitlines()) <= 2
            assert waited >= 1.0
        assert all_refs(store) == before  # neither the pull nor the tag moved anything
        assert holder.poll() is None, "the holder finished too early for the test to mean anything"
        # Reading needs no lock.
        log = run_snapver("log")
        assert log.code == 0 and "slow" in log.out, str(log)
    finally:
        out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err.decode()
    # The lock was released with the holder: the refused pull now goes through at once.
    result = run_snapver("pull", "fast", env={"SNAPVER_LOCK_WAIT": "0"})
    assert result.code == 0, str(result)
    assert all_refs(store)["refs/heads/nodes/fast"] != before["refs/heads/nodes/fast"]
    assert all_refs(store)["refs/heads/nodes/slow"] != before["refs/heads/nodes/slow"]


def test_a_sigkilled_holder_frees_the_lock_at_once(two_nodes, run_snapver, store) -> None:
    before = all_refs(store)
    holder = start_snapver("pull", "slow")
    wait_for(lambda: holding(store, holder.pid), 20, "the first pull to take the lock")
    os.kill(holder.pid, signal.SIGKILL)
    holder.communicate(timeout=30)
    assert holder.returncode == -signal.SIGKILL
    # The lock file is still there, naming the dead pid; that must not matter.
    assert holding(store, holder.pid)
    began = time.monotonic()
    result = run_snapver("pull", "fast", env={"SNAPVER_LOCK_WAIT": "0"})
    assert result.code == 0, str(result)
    assert time.monotonic() - began < 10
    after = all_refs(store)
    assert after["refs/heads/nodes/slow"] == before["refs/heads/nodes/slow"]  # the killed pull left no trace
    assert_store_sound(store, run_snapver, after)
