"""The pack writer: git itself must read every blob back, byte for byte."""

from __future__ import annotations

import hashlib
import os
import subprocess
import zlib
from pathlib import Path

import pytest
from helpers import git_blob

from snapver.store.objects import blob_oid
from snapver.store.pack import BLOB_TYPE, TREE_TYPE, WRITEBACK_EVERY, PackWriter, _index_bytes, object_id, stored_zlib
from snapver.store.repo import Store


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


def test_a_pack_larger_than_the_writeback_step_with_trees_verifies(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    blobs = [os.urandom(WRITEBACK_EVERY // 3) for _ in range(4)] + [b"small"]
    writer = PackWriter(store.path / "objects")
    for data in blobs:
        writer.add(blob_oid(data), data)
    tree = b"".join(sorted(b"100644 f%d\0" % i + bytes.fromhex(_git_oid(d)) for i, d in enumerate(blobs)))
    writer.add(object_id(TREE_TYPE, tree), tree, TREE_TYPE)
    assert object_id(BLOB_TYPE, b"small").hex() == _git_oid(b"small")
    pack = writer.finish()
    assert pack is not None and writer.size > WRITEBACK_EVERY
    tree_id = hashlib.sha1(b"tree %d\0" % len(tree) + tree).hexdigest()
    listing = subprocess.run(["git", "--git-dir", str(store.path), "ls-tree", tree_id], capture_output=True, text=True)
    assert listing.stdout.count("blob") == 5, listing.stderr
    fsck = subprocess.run(["git", "--git-dir", str(store.path), "fsck", "--full", "--strict"],
                          capture_output=True, text=True)
    assert fsck.returncode == 0, fsck.stdout + fsck.stderr
    assert git_blob(store.path, _git_oid(blobs[2])) == blobs[2]


@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 2 * 65535, 2 * 65535 + 1, 300_001])
def test_stored_zlib_streams_inflate_to_the_data(size: int) -> None:
    data = os.urandom(size)
    stream = b"".join(stored_zlib(data))
    assert zlib.decompress(stream) == data
    assert len(stream) == 2 + 5 * max(1, -(-size // 65535)) + size + 4  # stored: nothing compressed


def test_offsets_past_2_gib_go_to_the_large_offset_table_as_git_reads_it(tmp_path: Path) -> None:
    """A pack over 2 GiB (a store holding big .so files): the index's 4-byte offsets hold
    only those under 2^31; each later one is the MSB and its position in the table of 8-byte
    offsets (idx v2). Git's own reader (`git show-index`) gives every offset back; no 2 GiB
    file is needed to write the index."""
    offsets = [12, 0x7FFFFFFF, 0x80000000, 5 << 30, (1 << 40) + 7, 0xFFFFFFFF]
    entries = [(hashlib.sha1(b"%d" % i).digest(), 0x1000 + i, offset) for i, offset in enumerate(offsets)]
    index = _index_bytes(entries, b"\x11" * 20)
    shown = subprocess.run(["git", "show-index", "--object-format=sha1"], input=index, capture_output=True,
                           cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr.decode()
    read = {}
    for line in shown.stdout.decode().splitlines():
        offset, oid, crc = line.split()
        read[oid] = (int(offset), int(crc.strip("()"), 16))
    assert read == {oid.hex(): (offset, crc) for oid, crc, offset in entries}
    # The layout itself, by the format's rule: after the header, fan-out, ids and CRCs.
    ordered = sorted(entries)
    small = 8 + 256 * 4 + len(entries) * (20 + 4)
    words = [int.from_bytes(index[small + 4 * i:small + 4 * i + 4], "big") for i in range(len(entries))]
    large = [offset for _, _, offset in ordered if offset >= 1 << 31]
    assert [w for w in words if w < 1 << 31] == [offset for _, _, offset in ordered if offset < 1 << 31]
    assert [w & 0x7FFFFFFF for w in words if w >= 1 << 31] == list(range(len(large)))
    table = small + 4 * len(entries)
    assert [int.from_bytes(index[table + 8 * i:table + 8 * i + 8], "big") for i in range(len(large))] == large
