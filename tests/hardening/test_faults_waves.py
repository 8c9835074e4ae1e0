"""A push in waves under real faults between its waves: Ctrl-C during the pause, a node's
sshd session killed while it waits for its wave, a node lost for good before its wave.

Every way out of the wave loop ends as a failed wave does: the finished waves are rolled
back (a recorded rollback), the nodes never reached get a "cancelled" record, nothing says
"nothing was written" of a push that wrote a wave; a connection that died while it waited
is opened again. The push runs as a real process on a pseudo-terminal (``tests/terminal.py``):
Ctrl-C is a real SIGINT to its process group, the prompt between waves is where the test
acts while the push waits. Nodes are checked with the test's own hashing, records with git.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from pathlib import Path

import pytest
from faultkit import CuttingProxy, git, sshd_sessions_on, wait_for
from helpers import tree_hashes
from terminal import run_in_terminal

from snapver.config import load_config
from snapver.ops.patch import import_patch
from snapver.ops.pull import pull
from snapver.store.repo import Store

SRT = "sglang/srt"
NAMES = ("fleet00", "fleet01", "fleet02")
FIX = (f"--- a/{SRT}/a.py\n+++ b/{SRT}/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
       f"--- /dev/null\n+++ b/{SRT}/c.py\n@@ -0,0 +1 @@\n+c = 1\n").encode()
CONFIRM = (b"[y/N]: ", b"y\n")
WAVE_TWO = b"start wave 2 (fleet01, fleet02)? [y/N]: "


def records(store: Path, node: str) -> list[dict]:
    """A node's push records, newest first (their snapver-meta), read with git."""
    out = git(store, "log", "--format=%B%x00", f"refs/heads/pushes/{node}").decode()
    return [json.loads(line[len("snapver-meta: "):]) for body in out.split("\0")
            for line in body.splitlines() if line.startswith("snapver-meta: ")]


@pytest.fixture
def fleet(sshd, make_site_packages, ssh_node, write_config, tmp_path):
    """``fleet(proxies={})`` → the sites of fleet00-02 (ssh; a node in ``proxies`` reached
    through that relay), snapshotted, with patch ``fix`` (a.py changed, c.py added) for all."""

    def make(proxies: dict[str, CuttingProxy] | None = None) -> dict[str, Path]:
        sites = {name: make_site_packages(name, files={f"{SRT}/a.py": "a = 1\n", f"{SRT}/b.py": "b = 1\n"})
                 for name in NAMES}
        nodes = {}
        for name, site in sites.items():
            proxy = (proxies or {}).get(name)
            if proxy is None:
                nodes[name] = ssh_node(name, site)
                continue
            known_hosts = tmp_path / f"{name}_known_hosts"
            known_hosts.write_text(f"[{sshd.addresses[name]}]:{proxy.port} {sshd.host_public_key}\n")
            nodes[name] = ssh_node(name, site, port=proxy.port, known_hosts=str(known_hosts))
        config = load_config(str(write_config(nodes, groups={"all3": list(NAMES)})))
        store = Store.open_or_create(config.store_path)
        # The first snapshots through the local transport: what is under test is the push.
        local = [dataclasses.replace(spec, local=True, host=None) for spec in config.select(["all3"])]
        assert pull(store, local).exit_code == 0
        import_patch(store, config, "fix", FIX, "fix.diff", "fleet00", ["all3"])
        return sites

    return make


def assert_untouched(sites: dict[str, Path], original: dict[str, dict]) -> None:
    for name, site in sites.items():
        assert tree_hashes(site) == original[name], name
        assert not [p for p in site.rglob("*") if p.name.startswith(".snapver-")], name


def test_ctrl_c_during_the_pause_between_waves_rolls_back_the_finished_wave(fleet, store, run_snapver):
    """SIGINT while `push --waves 1,100% --pause 3600` waits for wave 2: exit 130, the canary
    rolled back (recorded), the two nodes never written get "cancelled" records that say
    the push was interrupted; the store lock is free after."""
    sites = fleet()
    original = {name: tree_hashes(site) for name, site in sites.items()}
    shown = run_in_terminal("--no-color", "push", "fix", "--yes", "--waves", "1,100%", "--pause", "3600",
                            interrupt_on=b"waiting 3600 s before wave 2", settle=0.3, timeout=120)
    text = shown.text
    assert shown.code == 130, text
    assert "snapver: interrupted" in text and "Traceback" not in text and "nothing was written" not in text, text
    assert "push stopped after 1 of 2 wave(s) finished; not written: fleet01, fleet02" in text, text
    assert "fleet00: rolled back as well" in text, text
    assert_untouched(sites, original)
    assert [(r["action"], r["state"]) for r in records(store, "fleet00")] == [
        ("rollback", "done"), ("rollback", "started"), ("push", "done"), ("push", "started")]
    for name in ("fleet01", "fleet02"):
        [record] = records(store, name)
        assert (record["state"], record["waves_finished"], record["interrupted"]) == ("cancelled", 1, True), record
    assert run_snapver("tag", "after-interrupt", "fleet00").code == 0


def test_a_session_killed_between_waves_is_opened_again(fleet, store, sshd):
    """The sshd sessions of the second wave's nodes are SIGKILLed while the push asks
    whether to start that wave: their connections are opened again and the wave is
    written as if nothing happened."""
    sites = fleet()

    def kill_wave_two() -> bytes:
        for name in ("fleet01", "fleet02"):
            sessions = sshd_sessions_on(sshd.dir, sshd.addresses[name])
            assert sessions, f"no session of {name} to kill"
            for pid in sessions:
                os.kill(pid, signal.SIGKILL)
            wait_for(
                lambda name=name: not sshd_sessions_on(sshd.dir, sshd.addresses[name]), 10, f"{name}'s session to end"
            )
        return b"y\n"

    shown = run_in_terminal("--no-color", "push", "fix", "--waves", "1,100%",
                            replies=[CONFIRM, (WAVE_TWO, kill_wave_two)], timeout=120)
    text = shown.text
    assert shown.code == 0, text
    assert "wave 2: fleet01, fleet02" in text and "all 2 wave(s) finished" in text, text
    for name, site in sites.items():
        assert (site / SRT / "a.py").read_text() == "a = 2\n" and (site / SRT / "c.py").read_text() == "c = 1\n"
        assert records(store, name)[0]["state"] == "done", name


def test_a_node_lost_for_good_between_waves_rolls_back_the_finished_wave(fleet, store, sshd, run_snapver):
    """fleet01's link goes down for good (its relay closes: the session ends, no new one is
    let in) while the push waits to start wave 2: exit 3 naming fleet01, never "nothing
    was written"; the finished canary rolled back, the second wave's nodes "cancelled"."""
    address = sshd.addresses["fleet01"]
    proxy = CuttingProxy(address, (address, sshd.port), cut_after=None)
    sites = fleet({"fleet01": proxy})
    original = {name: tree_hashes(site) for name, site in sites.items()}

    def lose_fleet01() -> bytes:
        proxy.close()
        wait_for(lambda: not sshd_sessions_on(sshd.dir, address), 10, "fleet01's session to end")
        return b"y\n"

    try:
        shown = run_in_terminal("--no-color", "push", "fix", "--waves", "1,100%",
                                replies=[CONFIRM, (WAVE_TWO, lose_fleet01)], timeout=120)
    finally:
        proxy.close()
    text = shown.text
    assert shown.code == 3, text
    assert "fleet01" in text and "Traceback" not in text and "nothing was written" not in text, text
    assert "push stopped after 1 of 2 wave(s) finished; not written: fleet01, fleet02" in text, text
    assert "fleet00: rolled back as well" in text, text
    assert_untouched(sites, original)
    assert [(r["action"], r["state"]) for r in records(store, "fleet00")][:2] == [("rollback", "done"),
                                                                               ("rollback", "started")]
    for name in ("fleet01", "fleet02"):
        [record] = records(store, name)
        assert (record["state"], record["waves_finished"]) == ("cancelled", 1), record
    assert "fleet01" in records(store, "fleet01")[0]["error"]
    assert run_snapver("tag", "after-loss", "fleet00").code == 0


def test_ctrl_c_at_the_question_before_a_wave_rolls_back_the_finished_wave(fleet, store):
    """On a terminal without --yes, SIGINT while the push asks "start wave 2?": as in the
    pause, exit 130 with the canary rolled back and the rest recorded "cancelled"."""
    sites = fleet()
    original = {name: tree_hashes(site) for name, site in sites.items()}
    shown = run_in_terminal("--no-color", "push", "fix", "--waves", "1,100%", replies=[CONFIRM],
                            interrupt_on=WAVE_TWO, settle=0.3, timeout=120)
    text = shown.text
    assert shown.code == 130, text
    assert "snapver: interrupted" in text and "Traceback" not in text, text
    assert "fleet00: rolled back as well (its wave finished before the interrupt)" in text, text
    assert_untouched(sites, original)
    assert records(store, "fleet00")[0]["action"] == "rollback"
    assert [records(store, name)[0]["state"] for name in ("fleet01", "fleet02")] == ["cancelled", "cancelled"]
