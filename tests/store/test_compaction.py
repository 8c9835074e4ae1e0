"""Background compaction: the store shrinks and loses nothing."""

from __future__ import annotations

import subprocess
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
