"""Background compaction: the store shrinks and loses nothing."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

from helpers import git_blob

from snapver.store import gc
from snapver.store.repo import Store


def _pack_bytes(store: Path) -> int:
    return sum(p.stat().st_size for p in (store / "objects" / "pack").glob("*.pack"))


def test_compact_recompresses_and_keeps_unreferenced_objects(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    text = b"".join(b"line %d of a very repetitive python module\n" % i for i in range(20000))
    with store.importer() as importer:
        oid = importer.add_blob(text)
    raw = _pack_bytes(store.path)
    assert raw > len(text)  # stored uncompressed by the pull path
    assert gc.record_raw_bytes(store.path, 0) >= len(text)
    assert gc.compact(store.path) == 0
    assert _pack_bytes(store.path) < raw / 5
    # No ref names the blob, and it is still there (-k): a pull mid-commit loses nothing.
    assert git_blob(store.path, oid) == text
    assert gc.record_raw_bytes(store.path, 0) == 0
    fsck = subprocess.run(["git", "--git-dir", str(store.path), "fsck", "--full"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr


def test_maybe_compact_waits_for_enough_raw_bytes_then_runs_in_the_background(tmp_path: Path, monkeypatch) -> None:
    store = Store.create(tmp_path / "store")
    monkeypatch.setenv("SNAPVER_AUTO_GC", "1")
    gc.record_raw_bytes(store.path, 1000)
    assert gc.maybe_compact(store.path) is None
    gc.record_raw_bytes(store.path, gc.RAW_BYTES_BEFORE_COMPACT)
    monkeypatch.setenv("SNAPVER_AUTO_GC", "0")
    assert gc.maybe_compact(store.path) is None
    monkeypatch.setenv("SNAPVER_AUTO_GC", "1")
    assert isinstance(gc.maybe_compact(store.path), int)
    deadline = time.monotonic() + 30
    while gc.record_raw_bytes(store.path, 0) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gc.record_raw_bytes(store.path, 0) == 0, "the background compaction ran and reset the count"


def test_compaction_streams_big_blobs_in_bounded_memory(tmp_path: Path) -> None:
    """Two similar 24 MiB blobs: an uncapped repack delta-searches them whole (~120 MiB
    peak here); the capped one streams them (~30 MiB) and the store stays sound."""
    store = Store.create(tmp_path / "store")
    first = os.urandom(24 << 20)
    second = first[:1000] + b"x" * 10 + first[1010:]
    with store.importer() as importer:
        oids = [importer.add_blob(first), importer.add_blob(second)]
    git = ["git", "--git-dir", str(store.path)]
    tree = subprocess.run([*git, "mktree"], input="".join(f"100644 blob {oid}\t{name}\n" for oid, name
                                                          in zip(oids, ("a.so", "b.so"), strict=False)),
                          capture_output=True, text=True, check=True).stdout.strip()
    commit = subprocess.run([*git, "-c", "user.name=t", "-c", "user.email=t@t", "commit-tree", "-m", "t", tree],
                            capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([*git, "update-ref", "refs/heads/big", commit], check=True)
    report = tmp_path / "peak"
    package_root = Path(gc.__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(package_root)}
    done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(report), sys.executable, "-m", "snapver.store.gc",
                           str(store.path)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    peak_mib = int(report.read_text().split()[-1]) / 1024
    assert peak_mib < 64, f"the repack peaked at {peak_mib:.0f} MiB"
    fsck = subprocess.run([*git, "fsck", "--full"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr
    for oid, data in zip(oids, (first, second), strict=False):
        assert hashlib.sha256(git_blob(store.path, oid)).digest() == hashlib.sha256(data).digest()


def test_a_streamed_big_blob_compacts_in_bounded_memory(tmp_path: Path) -> None:
    """A pull's streamed 96 MiB file is a pack of its own, which git reads through capped
    windows: the compaction peaked at ~70 MiB (as a loose object, which git maps whole, at ~103 MiB)."""
    store = Store.create(tmp_path / "store")
    piece = b"".join(b"%08d a line of a big shared library\n" % i for i in range(1 << 20 >> 5))[:1 << 20]
    pieces = 96
    with store.importer() as importer:
        oid = importer.add_blob_stream(len(piece) * pieces, [piece] * pieces)
    git = ["git", "--git-dir", str(store.path)]
    tree = subprocess.run([*git, "mktree"], input=f"100644 blob {oid}\tlib.so\n",
                          capture_output=True, text=True, check=True).stdout.strip()
    commit = subprocess.run([*git, "-c", "user.name=t", "-c", "user.email=t@t", "commit-tree", "-m", "t", tree],
                            capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([*git, "update-ref", "refs/heads/big", commit], check=True)  # a loose one is packed only if named
    report = tmp_path / "peak"
    env = {**os.environ, "PYTHONPATH": str(Path(gc.__file__).resolve().parents[2])}
    done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(report), sys.executable, "-m", "snapver.store.gc",
                           str(store.path)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    peak_mib = int(report.read_text().split()[-1]) / 1024
    assert peak_mib < 90, f"the repack peaked at {peak_mib:.0f} MiB"
    assert list((store.path / "objects" / "pack").glob("*.pack")) and _pack_bytes(store.path) < len(piece) * pieces / 5
    fsck = subprocess.run([*git, "fsck", "--full"], capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stderr
    read_back = hashlib.sha256()
    for chunk in store.blob_chunks(oid):
        read_back.update(chunk)
    assert read_back.digest() == hashlib.sha256(piece * pieces).digest()


def test_fsck_waits_for_a_running_compaction_and_none_starts_during_it(tmp_path: Path) -> None:
    """A repack deletes the packs it replaced as it ends, under an fsck that had them open:
    fsck called a sound store damaged (`packfile ... index not opened`, exit 4). A second
    process holding the compaction lock (as a running repack does) holds fsck back until it
    lets go; while fsck runs, a compaction does not start."""
    from snapver.ops.fsck import fsck

    store = Store.create(tmp_path / "store")
    with store.importer() as importer:
        importer.add_blob(b"x = 1\n")
    lock = store.path / gc.LOCK
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT, 0o644)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('held', flush=True)\ntime.sleep(1.5)\n")],
        stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    assert fsck(store).ok
    assert time.monotonic() - started >= 1.0  # it waited for the "compaction" to end
    assert holder.wait(timeout=10) == 0
    with gc.compaction_paused(store.path):
        assert gc.compact(store.path) == 0  # skipped: the lock is held
        assert gc.record_raw_bytes(store.path, 0) > 0  # ...so nothing was compacted
