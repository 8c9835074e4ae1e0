"""The pack writer: git itself must read every blob back, byte for byte."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

from helpers import git_blob

from snapver.store.pack import PackWriter
from snapver.store.repo import Store, blob_oid


def _git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def test_pack_is_read_by_git_and_verifies(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    blobs = [b"", b"x", b"hello\n" * 1000, os.urandom(3 << 20), bytes(range(256)) * 70]
    writer = PackWriter(store.path / "objects")
    for data in blobs:
        writer.add(blob_oid(data), data)
    pack = writer.finish()
    assert pack is not None and pack.with_suffix(".idx").exists()
    verify = subprocess.run(["git", "--git-dir", str(store.path), "verify-pack", "-v", str(pack.with_suffix(".idx"))],
                            capture_output=True, text=True)
    assert verify.returncode == 0, verify.stderr
    for data in blobs:
        oid = _git_oid(data)  # computed independently of snapver
        assert oid in verify.stdout
        assert git_blob(store.path, oid) == data
    fsck = subprocess.run(["git", "--git-dir", str(store.path), "fsck", "--full", "--strict"],
                          capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    assert not list((store.path / "objects" / "pack").glob("tmp_*"))


def test_an_aborted_pack_leaves_nothing_visible(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    writer = PackWriter(store.path / "objects")
    writer.add(blob_oid(b"half"), b"half")
    writer.abort()
    assert list((store.path / "objects" / "pack").iterdir()) == []
    assert store.existing([_git_oid(b"half")]) == set()


def test_an_empty_pack_writes_no_files(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    assert PackWriter(store.path / "objects").finish() is None
    assert list((store.path / "objects" / "pack").iterdir()) == []
