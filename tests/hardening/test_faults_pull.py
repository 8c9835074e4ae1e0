"""Pull under real faults: the process SIGKILLed, the sshd session killed, the TCP
connection reset, the store's disk full, a node file rewritten while it is read.

After each: the refs are exactly as before (no partial snapshot visible), `git fsck`
and `snapver fsck` are clean, nothing unfinished is left in the pack folder, and the
next pull succeeds and records the live tree exactly. A 32 MB tree of incompressible
files over ssh (~1 s to pull here) is hit when a quarter of it is in the store; the
real sglang tree is not needed for that (tests/ops/test_pull.py kills a pull of it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from faultkit import (
    CuttingProxy,
    all_refs,
    assert_store_sound,
    hostile_python,
    kill_sessions_once,
    live_blob_ids,
    pack_bytes,
    snapshot_blob_ids,
    sshd_session_pids,
    start_snapver,
    wait_for,
)

SRT = "sglang/srt"
MID_TRANSFER = 8 << 20  # bytes of the 32 MB in the store when the fault strikes


def temp_packs(store: Path) -> list[str]:
    """Unfinished packs snapver left in the store (a background `git repack` is off here)."""
    return sorted(p.name for p in (store / "objects" / "pack").glob("tmp_*"))


@pytest.fixture(scope="module")
def big_site(tmp_path_factory) -> Path:
    """32 MB of random (incompressible) content in 64 files; pulls never change it."""
    site = tmp_path_factory.mktemp("big") / "site-packages"
    for index in range(64):
        path = site / SRT / f"shard{index // 8}" / f"weights_{index:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(1 << 19))
    return site


@pytest.fixture
def fleet(big_site, small_site, ssh_node, local_node, write_config, run_snapver, store):
    """Node ``small`` already snapshotted; node ``ct200`` (``big_site``, over ssh) not yet."""

    def configure(**ct200_keys) -> dict:
        nodes = {"small": local_node(small_site), "ct200": ssh_node("ct200", big_site, **ct200_keys)}
        write_config(nodes)
        return nodes

    configure()
    first = run_snapver("pull", "small")
    assert first.code == 0, str(first)
    return configure


def assert_next_pull_is_exact(run_snapver, store: Path, site: Path) -> None:
    result = run_snapver("pull", "--json", "ct200")
    assert result.code == 0, str(result)
    assert json.loads(result.out)["nodes"][0]["snapshot"]
    assert snapshot_blob_ids(store, "refs/heads/nodes/ct200") == live_blob_ids(site)
    assert temp_packs(store) == []


def test_sigkill_mid_pull(fleet, run_snapver, store, big_site) -> None:
    before = all_refs(store)
    start_bytes = pack_bytes(store)
    pull = start_snapver("pull", "ct200")
    wait_for(lambda: pull.poll() is not None or pack_bytes(store) - start_bytes > MID_TRANSFER, 60,
             "the pull to be mid-transfer")
    assert pull.poll() is None, f"the pull ended before it could be killed: {pull.communicate()}"
    pull.send_signal(signal.SIGKILL)
    pull.communicate(timeout=30)
    assert temp_packs(store), "the kill did not strike while a pack was being written"
    assert_store_sound(store, run_snapver, before)
    # The next write removes what the killed one left in the pack folder.
    assert_next_pull_is_exact(run_snapver, store, big_site)


def test_sshd_session_killed_mid_pull(fleet, sshd, run_snapver, store, big_site) -> None:
    before = all_refs(store)
    existing = sshd_session_pids(sshd.dir)
    pull = start_snapver("pull", "ct200")
    killed = wait_for(lambda: pull.poll() is not None or kill_sessions_once(sshd.dir, existing, "wchar", MID_TRANSFER),
                      60, "the node's sshd to have sent 8 MB")
    assert killed is not True and pull.poll() is None, f"the pull ended first: {pull.communicate()}"
    out, err = pull.communicate(timeout=60)
    assert pull.returncode == 3, err.decode()
    assert "ct200" in err.decode() and "Traceback" not in err.decode()
    assert_store_sound(store, run_snapver, before)
    assert temp_packs(store) == []
    assert_next_pull_is_exact(run_snapver, store, big_site)


def test_connection_reset_mid_pull(fleet, sshd, run_snapver, store, big_site, tmp_path) -> None:
    address = sshd.addresses["ct200"]
    proxy = CuttingProxy(address, (address, sshd.port), cut_after=MID_TRANSFER)
    known_hosts = tmp_path / "proxy_known_hosts"
    known_hosts.write_text(f"[{address}]:{proxy.port} {sshd.host_public_key}\n")
    fleet(port=proxy.port, known_hosts=str(known_hosts))
    before = all_refs(store)
    try:
        result = run_snapver("pull", "ct200", timeout=90)
    finally:
        proxy.close()
    assert proxy.cut.is_set(), "the proxy never cut the connection"
    assert result.code == 3, str(result)
    assert "ct200" in result.err and "Traceback" not in result.err
    assert_store_sound(store, run_snapver, before)
    assert temp_packs(store) == []
    fleet()  # the link is back
    assert_next_pull_is_exact(run_snapver, store, big_site)


def test_store_disk_full(small_disk, small_site, make_site_packages, local_node, write_config, run_snapver) -> None:
    store = small_disk / "snapshots"
    big = make_site_packages("big", files={f"{SRT}/weights.bin": os.urandom(4 << 20),
                                           f"{SRT}/a.py": "a = 1\n"})
    write_config({"small": local_node(small_site), "big": local_node(big)}, store=str(store))
    assert run_snapver("pull", "small").code == 0
    before = all_refs(store)
    result = run_snapver("pull", "big")
    assert result.code == 4, str(result)
    assert "No space left" in result.err and "Traceback" not in result.err
    assert "internal error" not in result.err
    assert temp_packs(store) == []  # the half-written pack was removed, so the space is back
    assert_store_sound(store, run_snapver, before)
    # The next command that fits succeeds.
    (small_site / SRT / "server_args.py").write_text("port = 1\n")
    result = run_snapver("pull", "small")
    assert result.code == 0, str(result)
    assert snapshot_blob_ids(store, "refs/heads/nodes/small") == live_blob_ids(small_site)


OLD = b"A" * (1 << 20) + b"# old\n"
NEW = b"B" * (1 << 20) + b"# new version\n"


REWRITER = """
import os, sys, time
path, stop, log, versions = sys.argv[1], sys.argv[2], open(sys.argv[3], "a"), sys.argv[4:]
content, turn = [open(version, "rb").read() for version in versions], 0

def held(length, since):
    # A state half-way through a rewrite (version turn's first length bytes) that the file
    # may have kept for 80 ms or more: the writer stalled there (two busy cores, a throttled
    # cgroup). Called once the write that ended the state has returned: the state lasted
    # from since until some moment in that write (a stall inside the write counts too; it
    # was missed when timed before the write: an empty file held 100 ms went unlogged).
    now = time.monotonic()
    if now - since >= 0.08:
        log.write("%d %d %r %r\\n" % (turn, length, since, now))
        log.flush()

while not os.path.exists(stop):
    burst_end = time.monotonic() + 0.3
    while time.monotonic() < burst_end:
        turn ^= 1
        with open(path, "r+b") as handle:
            handle.truncate(0)
            since, length, data = time.monotonic(), 0, content[turn]
            for at in range(0, len(data), 1 << 16):
                handle.write(data[at:at + (1 << 16)])
                handle.flush()
                held(length, since)
                since, length = time.monotonic(), min(len(data), at + (1 << 16))
    time.sleep(0.3)
"""


def test_file_rewritten_while_read(make_site_packages, local_node, write_config, run_snapver, store) -> None:
    """A file rewritten in place, in a loop, during the pull: each snapshot holds it old or
    new, byte for byte — or the pull fails clearly and records nothing. (The agent reads
    files the same way over every transport.) The one other content a snapshot may hold is
    a state the writer itself left the file in for 80 ms or more during that pull (a stall
    between its truncate and its writes): the agent, rightly, took the file as it stood
    for its whole 100 ms settle time. A state the reader made (a mix, a prefix the writer
    did not stop at) is a torn snapshot."""
    site = make_site_packages("busy", files={f"{SRT}/hot.py": OLD, f"{SRT}/calm.py": "calm\n"})
    hot = site / SRT / "hot.py"
    write_config({"busy": local_node(site)})
    stop, stalls = site.parent / "stop-rewriting", site.parent / "stalls"
    # In place (truncate, then write in pieces), as `echo > file` or a careless editor does:
    # bursts of rewrites, then a pause in which a read can find the file settled. A process
    # of its own, ahead of the others (nice -10), that logs where it stalled.
    versions = [site.parent / "old", site.parent / "new"]
    for version, data in zip(versions, (OLD, NEW), strict=False):
        version.write_bytes(data)
    writer = subprocess.Popen([sys.executable, "-c", REWRITER, str(hot), str(stop), str(stalls),
                               *map(str, versions)], preexec_fn=lambda: os.setpriority(os.PRIO_PROCESS, 0, -10))
    outcomes, snapshots = [], []
    try:
        for _ in range(3):
            before = all_refs(store)
            began = time.monotonic()
            result = run_snapver("pull", "--json", "busy")
            ended = time.monotonic()
            outcomes.append(result.code)
            assert "Traceback" not in result.err
            if result.code == 0:
                head = all_refs(store)["refs/heads/nodes/busy"]
                blob = subprocess.run(["git", "--git-dir", str(store), "cat-file", "blob",
                                       f"{head}:{SRT}/hot.py"], capture_output=True, check=True).stdout
                snapshots.append((blob, began, ended))
            else:
                assert result.code == 3, str(result)
                assert "keeps changing while read" in result.out, result.out
                assert all_refs(store) == before
    finally:
        stop.touch()
        writer.wait(timeout=30)
    held = [line.split() for line in stalls.read_text().splitlines()] if stalls.exists() else []
    for blob, began, ended in snapshots:
        stalled_there = any(blob == (OLD, NEW)[int(turn)][:int(length)] and float(since) < ended and float(now) > began
                            for turn, length, since, now in held)
        assert blob in (OLD, NEW) or stalled_there, f"torn snapshot: {len(blob)} bytes, starts {blob[:8]!r}"
    assert_store_sound(store, run_snapver, all_refs(store))


FAILING_READ = '''
_honest_read_op = OPS["read"]
_honest_read_stable = read_stable

def _failing_read_stable(full, st):
    if str(full).endswith("/l3.py"):
        raise AgentError("%s: keeps changing while read" % full, "remote")
    return _honest_read_stable(full, st)

def _read_op(channel, request):
    global read_stable
    read_stable = _failing_read_stable
    try:
        _honest_read_op(channel, request)
    finally:
        read_stable = _honest_read_stable

OPS["read"] = _read_op
'''


def test_a_file_unreadable_mid_stream_fails_the_pull_in_step(small_site, local_node, write_config, snapver_process,
                                                             run_snapver, store, tmp_path) -> None:
    """The node cannot read one file half-way through the stream (it keeps changing, or a
    permission): the pull fails at once naming it — it used to wait forever, the node's
    error reply having put the stream out of step."""
    python = hostile_python(tmp_path / "node-python", FAILING_READ)
    write_config({"small": local_node(small_site, python=str(python))})
    result = snapver_process("pull", "small", timeout=60)
    assert result.code == 3, str(result)
    assert "l3.py: keeps changing while read" in result.err and "Traceback" not in result.err
    assert all_refs(store) == {}
    write_config({"small": local_node(small_site)})
    assert run_snapver("pull", "small").code == 0


def test_connection_reset_mid_diff(sshd, big_site, small_site, local_node, ssh_node, write_config, run_snapver,
                                   store, tmp_path) -> None:
    """`diff` fetches the content of changed files: cut while 32 MB of them stream."""
    write_config({"ct200": local_node(small_site)})  # an old snapshot of ct200 that shares nothing with big_site
    assert run_snapver("pull", "ct200").code == 0
    address = sshd.addresses["ct200"]
    proxy = CuttingProxy(address, (address, sshd.port), cut_after=MID_TRANSFER)
    known_hosts = tmp_path / "proxy_known_hosts"
    known_hosts.write_text(f"[{address}]:{proxy.port} {sshd.host_public_key}\n")
    write_config({"ct200": ssh_node("ct200", big_site, port=proxy.port, known_hosts=str(known_hosts))})
    before = all_refs(store)
    try:
        result = run_snapver("diff", "ct200@latest", "ct200")
    finally:
        proxy.close()
    assert proxy.cut.is_set(), "the diff finished before the cut"
    assert result.code == 3, str(result)[:2000]
    assert result.err.startswith("snapver: error: ct200") and "Traceback" not in result.err
    assert_store_sound(store, run_snapver, before)
    write_config({"ct200": ssh_node("ct200", big_site)})
    result = run_snapver("diff", "--name-status", "ct200@latest", "ct200")
    assert result.code == 1 and result.out.count("\n") == 64 + 14, str(result)[:2000]


def test_silent_partition_mid_pull(fleet, sshd, snapver_process, run_snapver, store, big_site, tmp_path) -> None:
    """The link goes silent (no RST, no FIN: a partition): the pull must not hang — nor hold
    the store lock — forever. SSH keepalives unanswered for 3 × connect_timeout end it."""
    address = sshd.addresses["ct200"]
    proxy = CuttingProxy(address, (address, sshd.port), cut_after=MID_TRANSFER, silent=True)
    known_hosts = tmp_path / "proxy_known_hosts"
    known_hosts.write_text(f"[{address}]:{proxy.port} {sshd.host_public_key}\n")
    fleet(port=proxy.port, known_hosts=str(known_hosts), connect_timeout=1)
    before = all_refs(store)
    began = time.monotonic()
    try:
        result = snapver_process("pull", "ct200", timeout=60)
    finally:
        proxy.close()
    assert proxy.cut.is_set(), f"the pull ended before the cut: {result}"
    assert result.code == 3, str(result)
    assert time.monotonic() - began < 20
    assert "ct200" in result.err and "Traceback" not in result.err
    assert_store_sound(store, run_snapver, before)
    fleet()
    assert_next_pull_is_exact(run_snapver, store, big_site)
