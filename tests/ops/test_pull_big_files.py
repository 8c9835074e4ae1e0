"""Pulls of nodes holding very large files (a 500 MB ``libtorch_cuda.so``): the file travels
in pieces and is hashed and written as it arrives, so memory stays bounded on both sides
(≤ 100 MiB for the client, ≤ 50 MiB for the node's agent) whatever its size, and a file
that changes while it streams is read again: the snapshot holds one version, never a mix.

Over the real sshd; results checked with git itself, hashlib and blake3, and peaks
measured by GNU time around the client and around the node's python.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import blake3
import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SRT = "sglang/srt"
BIG = f"{SRT}/lib/libbig.so"
TIME = "/usr/bin/time"  # GNU time: -f %M is the peak resident set of a command, in KiB
MiB = 1 << 20


def write_big(path: Path, mebibytes: int, seed: bytes) -> None:
    """``mebibytes`` MiB of random-looking content, fast: one random MiB, each copy of it
    stamped with its index (no two pieces alike, nothing a compressor could shrink)."""
    block = bytearray(hashlib.shake_256(seed).digest(MiB))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as handle:
        for index in range(mebibytes):
            block[:8] = index.to_bytes(8, "little")
            handle.write(block)


def file_digests(path: Path) -> tuple[str, str]:
    """(git blob id, blake3) of a file, read in pieces."""
    sha1 = hashlib.sha1(b"blob %d\0" % path.stat().st_size)
    digest = blake3.blake3()
    with open(path, "rb") as handle:
        while piece := handle.read(8 * MiB):
            sha1.update(piece)
            digest.update(piece)
    return sha1.hexdigest(), digest.hexdigest()


def git(store: Path, *args: str) -> bytes:
    done = subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


def require_gnu_time() -> None:
    if not os.access(TIME, os.X_OK):
        pytest.fail(f"{TIME} (GNU time) is needed to measure peak memory: apt-get install time")


def measured_python(folder: Path, env: dict[str, str] | None = None) -> tuple[Path, Path]:
    """A node-side ``python`` that runs this machine's python under GNU time, and the file
    where each run's peak resident set (KiB) is appended."""
    require_gnu_time()
    folder.mkdir(parents=True, exist_ok=True)
    report = folder / "agent-peak-kib"
    exports = "".join(f"export {name}='{value}'\n" for name, value in (env or {}).items())
    wrapper = folder / "python"
    wrapper.write_text(f'#!/bin/sh\n{exports}exec {TIME} -a -f %M -o {report} {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, report


def snapver_measured(*args: str, cwd: Path | None = None, timeout: float = 120) -> tuple[int, str, int]:
    """``python -m snapver ARGS`` under GNU time: (exit code, stdout + stderr, peak KiB). GNU time
    forks it from its own small process (a child forked from pytest would start with
    pytest's resident set as its high-water mark)."""
    require_gnu_time()
    report = Path.cwd() / "client-peak-kib"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run([TIME, "-f", "%M", "-o", str(report), sys.executable, "-m", "snapver", *args],
                          cwd=cwd, env=env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
    output = (done.stdout + done.stderr).decode(errors="replace")
    return done.returncode, output, int(report.read_text().split()[-1])


def agent_peaks(report: Path) -> list[int]:
    """Peaks (KiB) of the agents run so far; they write it as they exit, after the client left."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not report.exists():
        time.sleep(0.05)
    return [int(word) for word in report.read_text().split() if word.isdigit()]


def test_a_500mb_class_file_is_pulled_in_bounded_memory_and_hashed_right(
        sshd, make_site_packages, ssh_node, write_config, tmp_path) -> None:
    """A 300 MB file: the client stays within 100 MiB, the agent within 50 MiB (main
    needed ~3x and ~2x the file); the snapshot's blob is the file byte for byte (git's
    own id, checked by git fsck), its manifest digest its blake3; a small file beside it
    travels the small-file way. Then `diff -q` and `diff` against the node, after the
    file changed there, hold no file whole either."""
    site = make_site_packages("ct200", files={f"{SRT}/__init__.py": "x = 1\n"})
    write_big(site / BIG, 300, b"first")
    python, agent_report = measured_python(tmp_path / "node-python")
    write_config({"ct200": ssh_node("ct200", site, python=str(python))})
    code, err, client_kib = snapver_measured("pull", "ct200")
    assert code == 0, err
    store = Path.cwd() / "snapshots"
    oid, digest = file_digests(site / BIG)
    tree = dict(line.split(b"\t")[::-1] for line in git(store, "ls-tree", "-r", "nodes/ct200").splitlines())
    assert tree[BIG.encode()].split()[2].decode() == oid
    assert git(store, "cat-file", "-s", oid).strip() == str(300 * MiB).encode()
    manifest = git(store, "show", "nodes/ct200:.snapver/manifest").decode()
    assert digest in manifest
    assert tree[f"{SRT}/__init__.py".encode()].split()[2] == hashlib.sha1(b"blob 6\0x = 1\n").hexdigest().encode()
    git(store, "fsck", "--full", "--strict", "--no-dangling")  # every object re-hashed by git
    assert client_kib <= 100 * 1024, f"client peak {client_kib // 1024} MiB"
    peaks = agent_peaks(agent_report)
    assert peaks and max(peaks) <= 50 * 1024, f"agent peaks {[p // 1024 for p in peaks]} MiB"
    # `show` of the file streams it out of the store (it read the blob whole: ~300 MiB).
    shown = tmp_path / "shown.so"
    with open(shown, "wb") as out:
        done = subprocess.run([TIME, "-f", "%M", "-o", str(tmp_path / "show-kib"), sys.executable, "-m", "snapver",
                               "show", "ct200", BIG], stdout=out, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                              env={**os.environ, "PYTHONPATH": str(REPO_ROOT)}, timeout=300)
    assert done.returncode == 0, done.stderr
    assert file_digests(shown)[0] == oid
    show_kib = int((tmp_path / "show-kib").read_text().split()[-1])
    assert show_kib <= 100 * 1024, f"show: client peak {show_kib // 1024} MiB"
    shown.unlink()

    with open(site / BIG, "r+b") as handle:  # the node's copy changes: hashed there, in pieces
        handle.seek(123 * MiB)
        handle.write(b"hot-fixed")
    code, err, client_kib = snapver_measured("diff", "-q", "ct200")
    assert code == 1, err
    assert client_kib <= 100 * 1024, f"diff -q: client peak {client_kib // 1024} MiB"
    # A full diff shows it as binary (as git does above core.bigFileThreshold), reading neither side.
    code, out, client_kib = snapver_measured("diff", "ct200")
    assert code == 1 and f"Binary files a/{BIG} and b/{BIG} differ" in out, out
    assert client_kib <= 100 * 1024, f"diff: client peak {client_kib // 1024} MiB"
    assert max(agent_peaks(agent_report)) <= 50 * 1024


HOOK_ACTIONS = ["rewrite", "shrink", "grow", "vanish"]


@pytest.mark.parametrize("action", HOOK_ACTIONS)
def test_a_big_file_that_changes_while_it_streams_is_sent_again(
        sshd, make_site_packages, ssh_node, write_config, tmp_path, action: str) -> None:
    """The node's agent pauses after the first MiB of a 12 MiB file (a test hook) while the
    file is rewritten in place, shrunk, grown or removed; it sees the change when the
    read ends and sends the file again (or says it is gone). The snapshot holds the file
    as it is now, whole — never the first MiB of one version and the rest of another —
    and the stream stays in step (the file after it arrives too)."""
    site = make_site_packages("ct200", files={f"{SRT}/zz_after.py": "after = 1\n"})
    path = site / BIG
    write_big(path, 12, b"old")
    old_mtime = time.time() - 60
    os.utime(path, (old_mtime, old_mtime))
    hook = tmp_path / "hook"
    hook.mkdir()
    python, _ = measured_python(tmp_path / "node-python", {"SNAPVER_TEST_STREAMED_HOOK": str(hook)})
    write_config({"ct200": ssh_node("ct200", site, python=str(python))})
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    process = subprocess.Popen([sys.executable, "-m", "snapver", "pull", "ct200"], env=env,
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_file(hook / "streamed-1", process)
        if action == "rewrite":  # same size and inode, new content: a read would be torn
            new = tmp_path / "new"
            write_big(new, 12, b"new")
            with open(path, "r+b") as handle:
                handle.write(new.read_bytes())
        elif action == "shrink":
            os.truncate(path, 5 * MiB + 7)
        elif action == "grow":
            with open(path, "ab") as handle:
                handle.write(b"appended")
        else:
            path.unlink()
        (hook / "go-1").touch()
        while process.poll() is None:  # let every further read of it go on
            for started in hook.glob("streamed-*"):
                (hook / started.name.replace("streamed", "go")).touch()
            time.sleep(0.01)
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()
        process.wait()
    assert process.returncode == 0, err.decode(errors="replace")
    store = Path.cwd() / "snapshots"
    tree = dict(line.split(b"\t")[::-1] for line in git(store, "ls-tree", "-r", "nodes/ct200").splitlines())
    assert tree[f"{SRT}/zz_after.py".encode()].split()[2] == hashlib.sha1(b"blob 10\0after = 1\n").hexdigest().encode()
    if action == "vanish":
        assert BIG.encode() not in tree
    else:
        oid, digest = file_digests(path)
        assert tree[BIG.encode()].split()[2].decode() == oid  # as it is now, whole
        assert digest in git(store, "show", "nodes/ct200:.snapver/manifest").decode()
        assert (hook / "streamed-2").exists() and not (hook / "streamed-3").exists()  # read again once
    git(store, "fsck", "--full", "--strict", "--no-dangling")


def wait_for_file(path: Path, process: subprocess.Popen[bytes], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"snapver ended ({process.returncode}) before {path.name}: "
                                 f"{process.stderr.read().decode(errors='replace') if process.stderr else ''}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {path.name}")
        time.sleep(0.01)
