"""What a push or rollback sends: each file's content read from a real store in pieces."""

from __future__ import annotations

import os
from pathlib import Path

from snapver.model import FILE, Entry
from snapver.ops.plan import CHUNK, _contents
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
