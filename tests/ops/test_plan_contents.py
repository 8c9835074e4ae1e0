"""What a push or rollback sends: each file's content read from a real store in pieces (packed or loose)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from snapver.errors import StoreError
from snapver.model import FILE, Entry
from snapver.ops import nodeio
from snapver.ops.nodeio import CHUNK, _contents
from snapver.store.repo import BIG_BLOB, Store


def _entry(path: str, data: bytes, oid: str) -> Entry:
    return Entry(path, FILE, 0o100644, len(data), "", oid)


def test_contents_come_in_order_in_pieces_with_repeats_and_big_blobs(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    small, other, big = b"x = 1\n" * 1000, b"", os.urandom(BIG_BLOB + CHUNK + 17)
    with store.importer() as importer:
        oids = {data: importer.add_blob(data) for data in (small, other, big)}
    # The same small blob twice (two paths, one content), around a big one and an empty one.
    order = [("a.py", small), ("lib.so", big), ("b.py", small), ("empty.py", other), ("c.py", small)]
    contents = _contents(store, [_entry(path, data, oids[data]) for path, data in order])
    got = []
    for pieces in contents:
        chunks = list(pieces)
        assert all(0 < len(chunk) <= CHUNK for chunk in chunks)
        got.append(b"".join(chunks))
    assert got == [data for _path, data in order]


def test_a_big_blob_closed_half_way_ends_quietly(tmp_path: Path) -> None:
    """An interrupted send closes the stream mid-blob: no error about the object, git ends."""
    store = Store.create(tmp_path / "store")
    big = os.urandom(BIG_BLOB * 2)
    with store.importer() as importer:
        oid = importer.add_blob(big)
    pieces = store.blob_chunks(oid, CHUNK)
    assert next(pieces) == big[:CHUNK]
    pieces.close()
    assert store.blob_head(oid) == big[:8000]


def _loose(store: Store, data: bytes, tmp_path: Path, compression: str = "0") -> str:
    """``data`` written as a loose object by git itself (core.compression 0: stored blocks,
    as a pull streams big blobs; else git's own deflate)."""
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    oid = subprocess.run(["git", "--git-dir", str(store.path), "-c", f"core.compression={compression}",
                          "hash-object", "-w", str(source)], capture_output=True, text=True, check=True).stdout.strip()
    source.unlink()
    assert (store.path / "objects" / oid[:2] / oid[2:]).is_file()
    return oid


def test_a_big_loose_blob_is_read_in_pieces_in_bounded_memory(tmp_path: Path) -> None:
    """git maps a loose object whole (a 128 MiB one peaked at ~130 MiB); read in pieces here."""
    store = Store.create(tmp_path / "store")
    data = os.urandom(128 << 20)
    oid = _loose(store, data, tmp_path)
    wanted = hashlib.sha256(data).hexdigest()
    del data
    script = ("import hashlib, sys\nfrom pathlib import Path\nfrom snapver.store.repo import Store\n"
              "digest = hashlib.sha256()\n"
              "for piece in Store(Path(sys.argv[1])).blob_chunks(sys.argv[2]):\n"
              "    assert 0 < len(piece) <= 1 << 20\n    digest.update(piece)\n"
              "print(digest.hexdigest())\n")
    report = tmp_path / "peak"
    package_root = Path(nodeio.__file__).resolve().parents[2]
    done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(report), sys.executable, "-c", script,
                           str(store.path), oid], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(package_root)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == wanted
    peak_mib = int(report.read_text().split()[-1]) / 1024
    assert peak_mib < 64, f"reading the blob peaked at {peak_mib:.0f} MiB"


def test_loose_blobs_of_git_s_own_deflate_read_back_and_damage_is_reported(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    text = b"".join(b"line %d\n" % i for i in range(400000))  # compresses: many pieces per read
    oid = _loose(store, text, tmp_path, compression="6")
    assert b"".join(store.blob_chunks(oid, 4096)) == text
    assert store.blob_head(oid) == text[:8000]
    path = store.path / "objects" / oid[:2] / oid[2:]
    damaged = bytearray(path.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    os.chmod(path, 0o644)
    path.write_bytes(bytes(damaged[:len(damaged) - 10]))  # flipped and cut short
    with pytest.raises(StoreError, match="corrupt"):
        b"".join(store.blob_chunks(oid))
