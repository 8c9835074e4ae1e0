"""Push and diff under real faults: the connection reset mid-write (once, or for good),
the sshd session killed mid-write, snapver SIGKILLed mid-write, the store's disk full.

The patch touches ``a.py`` (changed), ``big.bin`` (24 MB, added) and ``z.py`` (changed),
written in that order, so a fault while ``big.bin`` streams finds one file written and
one not. After each fault, every file on the node is either its old or its new version
byte for byte (never a mix, never a temporary file left), the push records say what
happened, `snapver fsck` is clean, and the next command — the push again, or the
rollback the record asks for — succeeds. (tests/ops/test_push.py SIGKILLs a push paused
by a test hook and covers health-check failures mid-fleet.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest
from faultkit import (
    CuttingProxy,
    all_refs,
    assert_store_sound,
    kill_sessions_once,
    run_process,
    snapshot_blob_ids,
    sshd_session_pids,
    start_snapver,
    wait_for,
)

SRT = "sglang/srt"
A, BIG, Z = f"{SRT}/a.py", f"{SRT}/big.bin", f"{SRT}/z.py"
OLD = {A: b"a = 1\n", Z: b"z = 1\n"}
BIG_CONTENT = os.urandom(24 << 20)
NEW = {A: b"a = 2\n", BIG: BIG_CONTENT, Z: b"z = 2\n"}
PUSHES = "refs/heads/pushes/"


@pytest.fixture
def node(make_site_packages) -> Path:
    return make_site_packages("node", files={**OLD, f"{SRT}/keep.py": "keep\n"})


@pytest.fixture
def patched(node, ssh_node, write_config, run_snapver, store):
    """Node ``n`` (ssh) snapshotted, and patch ``fix`` (NEW) made through a checkout.

    Returns ``configure(**ssh_keys)`` to point the node elsewhere (a proxy)."""

    def configure(**keys) -> None:
        write_config({"n": ssh_node("ct200", node, **keys)})

    configure()
    assert run_snapver("pull", "n").code == 0
    assert run_snapver("patch", "new", "fix", "--base", "n").code == 0
    checkout = Path.cwd() / ".snapver-patches" / "fix"
    for path, data in NEW.items():
        (checkout / path).write_bytes(data)
    result = run_snapver("patch", "save", "fix")
    assert result.code == 0, str(result)
    return configure


def node_state(site: Path) -> dict[str, str]:
    """Per touched file: "old", "new" — anything else fails the test."""
    state = {}
    for path in NEW:
        full = site / path
        data = full.read_bytes() if full.exists() else None
        if data == NEW[path]:
            state[path] = "new"
        elif data == OLD.get(path):  # None for big.bin: absent before the push
            state[path] = "old"
        else:
            raise AssertionError(f"{path} is neither old nor new: {None if data is None else len(data)} bytes")
    leftovers = [str(p) for p in site.rglob("*") if p.name.startswith(".snapver-")]
    assert leftovers == [], f"temporary files left on the node: {leftovers}"
    return state


def newest_record(store: Path) -> dict:
    body = subprocess.run(["git", "--git-dir", str(store), "log", "-1", "--format=%B", PUSHES + "n"],
                          capture_output=True, text=True, check=True).stdout
    line = next(x for x in body.splitlines() if x.startswith("snapver-meta: "))
    return json.loads(line[len("snapver-meta: "):])


def assert_push_then_succeeds(run_snapver, node: Path, store: Path) -> None:
    result = run_snapver("push", "fix", "n", "--yes")
    assert result.code == 0, str(result)
    assert set(node_state(node).values()) == {"new"}
    assert newest_record(store)["state"] == "done"
    assert snapshot_blob_ids(store, "refs/heads/nodes/n")[BIG] == subprocess.run(
        ["git", "hash-object", "--stdin"], input=BIG_CONTENT, capture_output=True, check=True).stdout.decode().strip()


def proxied(sshd, patched, tmp_path: Path, **proxy_keys) -> CuttingProxy:
    address = sshd.addresses["ct200"]
    proxy = CuttingProxy(address, (address, sshd.port), **proxy_keys)
    known_hosts = tmp_path / "proxy_known_hosts"
    known_hosts.write_text(f"[{address}]:{proxy.port} {sshd.host_public_key}\n")
    patched(port=proxy.port, known_hosts=str(known_hosts))
    return proxy


def test_connection_reset_mid_push_is_rolled_back(sshd, patched, node, run_snapver, store, tmp_path) -> None:
    proxy = proxied(sshd, patched, tmp_path, cut_after=8 << 20, upload=True)
    try:
        result = run_snapver("push", "fix", "n", "--yes")
    finally:
        proxy.close()
    assert proxy.cut.is_set()
    assert result.code == 3, str(result)
    assert "Traceback" not in result.err and "rolled back" in result.err
    # The link came back at once: the node was put back as it was, over a new connection.
    assert set(node_state(node).values()) == {"old"}
    assert newest_record(store)["state"] == "rolled-back"
    assert_store_sound(store, run_snapver, all_refs(store))
    patched()
    assert_push_then_succeeds(run_snapver, node, store)


def test_connection_lost_for_good_mid_push_is_repaired_by_rollback(sshd, patched, node, run_snapver, store,
                                                                    tmp_path) -> None:
    proxy = proxied(sshd, patched, tmp_path, cut_after=8 << 20, upload=True, stay_down=True)
    try:
        result = run_snapver("push", "fix", "n", "--yes")
    finally:
        proxy.close()
    assert result.code == 3, str(result)
    assert "Traceback" not in result.err and "snapver rollback n" in result.err
    # Cut while big.bin streamed: every file was only staged, so nothing was committed (and
    # the staged files went with the agent when its session ended).
    wait_for(lambda: not any(p.name.startswith(".snapver-") for p in node.rglob("*")), 30, "staged files removed")
    assert set(node_state(node).values()) == {"old"}
    assert newest_record(store)["state"] == "failed"
    assert_store_sound(store, run_snapver, all_refs(store))
    patched()  # the link is back
    result = run_snapver("rollback", "n", "--yes")
    assert result.code == 0, str(result)
    assert set(node_state(node).values()) == {"old"}
    assert_push_then_succeeds(run_snapver, node, store)


@pytest.mark.parametrize("fault", ["sshd session killed", "snapver SIGKILLed"])
def test_killed_mid_push(fault, sshd, patched, node, run_snapver, store) -> None:
    existing = sshd_session_pids(sshd.dir)
    push = start_snapver("push", "fix", "n", "--yes")
    if fault == "snapver SIGKILLed":
        wait_for(lambda: push.poll() is not None or (node / A).read_bytes() == NEW[A], 60, "a.py to be written")
        assert push.poll() is None, push.communicate()
        push.send_signal(signal.SIGKILL)
    else:
        # Kill once the node's sshd has received 8 MB of big.bin (a.py came first, whole).
        killed = wait_for(lambda: push.poll() is not None or kill_sessions_once(sshd.dir, existing, "rchar", 8 << 20),
                          60, "the node's sshd to have received 8 MB")
        assert killed is not True and push.poll() is None, push.communicate()
    out, err = push.communicate(timeout=60)
    if fault == "snapver SIGKILLed":
        # Nothing could undo it: the record says the push was interrupted, rollback repairs it. The
        # node had every file staged: it commits them all, in one quick step, client or no client.
        assert push.returncode == -signal.SIGKILL
        wait_for(lambda: node_state(node)[Z] == "new", 30, "z.py to be committed too")
        assert newest_record(store)["state"] == "started"
        status = run_snapver("status", "n")
        assert "interrupted" in (status.out + status.err).lower(), str(status)
        assert run_snapver("rollback", "n", "--yes").code == 0
    else:
        # The connection died, not snapver: it rolled the node back over a new one.
        assert push.returncode == 3, err.decode()
        assert "Traceback" not in err.decode(), err.decode()
        assert newest_record(store)["state"] == "rolled-back"
    assert set(node_state(node).values()) == {"old"}
    assert_store_sound(store, run_snapver, all_refs(store))
    assert_push_then_succeeds(run_snapver, node, store)


def test_store_disk_full_refuses_the_push_before_any_write(small_disk, node, local_node, write_config, run_snapver,
                                                           tmp_path) -> None:
    store = small_disk / "snapshots"
    write_config({"n": local_node(node)}, store=str(store))
    assert run_snapver("pull", "n").code == 0
    diff = tmp_path / "fix.diff"
    diff.write_text(f"--- a/{A}\n+++ b/{A}\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    assert run_snapver("patch", "import", "fix", str(diff), "--base", "n").code == 0
    # A hand-made change elsewhere on the node: the snapshot taken before writing needs room for it.
    (node / SRT / "keep.py").write_bytes(os.urandom(4 << 20))
    before = all_refs(store)
    result = run_snapver("push", "fix", "n", "--yes")
    assert result.code == 4, str(result)
    assert "No space left" in result.err and "nothing was written" in result.err
    assert (node / A).read_bytes() == OLD[A]
    assert all_refs(store) == before
    assert_store_sound(store, run_snapver, before)
    (node / SRT / "keep.py").write_text("keep\n")  # room again: the same push goes through
    result = run_snapver("push", "fix", "n", "--yes")
    assert result.code == 0, str(result)
    assert (node / A).read_bytes() == NEW[A]


def test_store_full_after_the_node_was_written_names_the_node(small_disk, node, local_node, write_config,
                                                             tmp_path) -> None:
    """The store's disk fills up while the node is being written (a racer fills it during the
    pause after the write): the push cannot record its outcome — it says so, names the node it
    wrote and how to undo it (exit 4), and with room again that rollback works."""
    store = small_disk / "snapshots"
    write_config({"n": local_node(node)}, store=str(store))
    assert run_process("pull", "n").code == 0
    diff = tmp_path / "fix.diff"
    diff.write_text(f"--- a/{A}\n+++ b/{A}\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    assert run_process("patch", "import", "fix", str(diff), "--base", "n").code == 0
    push = start_snapver("push", "fix", "n", "--yes", env={"SNAPVER_TEST_PAUSE_AFTER_WRITE": "2"})
    wait_for(lambda: push.poll() is not None or (node / A).read_bytes() == NEW[A], 60, "the node to be written")
    filler = small_disk / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=64k"], capture_output=True)  # until ENOSPC
    out, err = push.communicate(timeout=60)
    assert push.returncode == 4, err.decode()
    assert "n was written" in err.decode() and "snapver rollback n" in err.decode(), err.decode()
    filler.unlink()
    result = run_process("rollback", "n", "--yes")
    assert result.code == 0, str(result)
    assert (node / A).read_bytes() == OLD[A]
