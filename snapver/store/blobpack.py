"""A large blob rewritten as a pack of its own, hashed in the same pass (no read-back).

A pull writes each large file (one the node streams in pieces) as a loose object as it
arrives: the cheapest correct encoding on the pull's path (blob id, adler32 and blake3
only). But git maps a loose object whole, so a compaction reading big loose blobs would
hold each whole. Before it repacks, the compaction (``gc.py``) rewrites every big loose
blob, a piece at a time, as a pack holding only it, which git reads through capped
windows (``gc.REPACK_CAPS``). The object count (1) is known up front, so the pack's header
and checksum need no second pass; the crc32 and SHA-1 are computed off the pull's path.

The pack and its index are written under temporary names in ``objects/pack`` (names
``remove_dead_writers_packs`` clears when their writer died) and take their final names
with ``place``.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from pathlib import Path

from snapver.store.loose import StoredBlobFile
from snapver.store.pack import BLOB_TYPE, TEMP_PREFIX, ZLIB_HEADER, _index_bytes, _object_header, _read_only_mode

PACK_HEADER = b"PACK" + struct.pack(">II", 2, 1)  # version 2, one object
OBJECT_OFFSET = len(PACK_HEADER)


class BlobPack(StoredBlobFile):
    """One blob of a size known up front, written piece by piece as a pack holding only it.

    ``write`` each piece, then ``close`` (which writes the index and returns the blob id);
    ``place`` makes the pack visible, ``abort`` removes it.
    """

    def __init__(self, objects_dir: Path, size: int) -> None:
        self.pack_dir = objects_dir / "pack"
        self.pack_dir.mkdir(parents=True, exist_ok=True)
        tmp_path = self.pack_dir / f"{TEMP_PREFIX}{os.getpid()}_blob_{id(self):x}"
        self.tmp_idx = self.pack_dir / f"{tmp_path.name}_idx"
        self._pack_sha: bytes | None = None
        self._crc = 0  # of the packed object: its header and zlib stream (the index records it)
        self._in_object = False  # the pack's own header and trailer are not the object's
        self._pack_hash = hashlib.sha1(usedforsecurity=False)  # of every byte of the pack: its trailer
        super().__init__(tmp_path, size)
        self._write_all([PACK_HEADER])
        self._in_object = True
        self._emit([_object_header(BLOB_TYPE, size), ZLIB_HEADER], b"")

    def _account(self, parts: list[bytes | memoryview]) -> None:
        for part in parts:
            self._pack_hash.update(part)
            if self._in_object:
                self._crc = zlib.crc32(part, self._crc)

    def _after_stream(self) -> None:
        self._in_object = False
        self._pack_sha = self._pack_hash.digest()
        self._write_all([self._pack_sha])

    def close(self) -> str:
        """End the zlib stream and the pack, write its index, make both durable; returns the blob id."""
        oid = super().close()
        assert self._pack_sha is not None
        with open(self.tmp_idx, "xb") as handle:
            handle.write(_index_bytes([(bytes.fromhex(oid), self._crc, OBJECT_OFFSET)], self._pack_sha))
            handle.flush()
            os.fchmod(handle.fileno(), _read_only_mode())
            os.fsync(handle.fileno())
        return oid

    def place(self) -> None:
        """Give the closed pack, then its index, their names in the store (git sees a pack
        by its index, so it is never seen half there; the same content may be there already)."""
        assert self._pack_sha is not None
        name = f"pack-{self._pack_sha.hex()}"
        os.replace(self.tmp_path, self.pack_dir / f"{name}.pack")
        os.replace(self.tmp_idx, self.pack_dir / f"{name}.idx")

    def abort(self) -> None:
        """Remove the temporary files (nothing was placed)."""
        super().abort()
        self.tmp_idx.unlink(missing_ok=True)
