"""A large blob rewritten as a pack of its own, hashed in the same pass (no read-back).

A pull writes each large file (one the node streams in pieces) as a loose object as it
arrives: the cheapest correct encoding on the pull's path (blob id, adler32 and blake3
only). But git maps a loose object whole, so the background compaction of a store holding
a 500 MB loose ``.so`` peaked at 595 MiB. Before it repacks, the compaction (``gc.py``)
rewrites every big loose blob, a piece at a time, as a pack holding only it, which git
reads through capped windows (81 MiB on the torch store, ``gc.REPACK_CAPS``). The object
count (1) is known up front, so the pack's header and checksum need no second pass; the
packed object's crc32 (for the index) and the pack's SHA-1 cost ~0.5 s of CPU per
500 MiB, off the pull's path.

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
from snapver.store.pack import (
    BLOB_TYPE,
    STORED_BLOCK,
    TEMP_PREFIX,
    WRITEBACK_EVERY,
    ZLIB_HEADER,
    _index_bytes,
    _object_header,
    _read_only_mode,
    _start_writeback,
)

PACK_HEADER = b"PACK" + struct.pack(">II", 2, 1)  # version 2, one object
OBJECT_OFFSET = len(PACK_HEADER)


class BlobPack:
    """One blob of a size known up front, written piece by piece as a pack holding only it.

    ``write`` each piece, then ``close`` (which writes the index and returns the blob id);
    ``place`` makes the pack visible, ``abort`` removes it. Content that turns out longer
    or shorter than ``size`` is refused (ValueError): the object would not be the one its
    id names.
    """

    def __init__(self, objects_dir: Path, size: int) -> None:
        self.pack_dir = objects_dir / "pack"
        self.pack_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_path = self.pack_dir / f"{TEMP_PREFIX}{os.getpid()}_blob_{id(self):x}"
        self.tmp_idx = self.pack_dir / f"{self.tmp_path.name}_idx"
        self.size = size
        self.oid: str | None = None
        self._pack_sha: bytes | None = None
        self._fd: int | None = os.open(self.tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._written = 0  # bytes of the file
        self._written_back = 0
        self._sha1 = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
        self._adler = zlib.adler32(b"")
        self._crc = 0  # of the packed object: its header and zlib stream (the index records it)
        self._pack_hash = hashlib.sha1(usedforsecurity=False)  # of every byte of the pack: its trailer
        self._left = size  # bytes of content still to come
        self._block_left = 0  # of the current stored block
        self._write_all([PACK_HEADER], in_object=False)
        self._emit([_object_header(BLOB_TYPE, size), ZLIB_HEADER], b"")

    def write(self, piece: bytes | memoryview) -> None:
        """Append the next piece of the content (hashed, then written)."""
        if len(piece) > self._left:
            raise ValueError(f"more content than the {self.size} bytes announced")
        if not piece:
            return
        self._sha1.update(piece)
        self._adler = zlib.adler32(piece, self._adler)
        self._emit([], piece)

    def _emit(self, parts: list[bytes | memoryview], data: bytes | memoryview) -> None:
        """Write ``parts`` then ``data`` cut into stored blocks (5-byte headers between), in one writev."""
        view = memoryview(data).cast("B")
        if not self._left and not self._block_left and not view:
            # Empty content: one empty final block (what zlib.compress(b"", 0) holds).
            parts.append(struct.pack("<BHH", 1, 0, 0xFFFF))
        while view:
            if not self._block_left:
                length = min(STORED_BLOCK, self._left)
                parts.append(struct.pack("<BHH", length == self._left, length, length ^ 0xFFFF))
                self._block_left = length
            taken = min(len(view), self._block_left)
            parts.append(view[:taken])
            view = view[taken:]
            self._block_left -= taken
            self._left -= taken
        self._write_all(parts)

    def _write_all(self, parts: list[bytes | memoryview], in_object: bool = True) -> None:
        assert self._fd is not None
        for part in parts:
            self._pack_hash.update(part)
            if in_object:
                self._crc = zlib.crc32(part, self._crc)
        total = sum(len(part) for part in parts)
        done = os.writev(self._fd, parts)
        if done < total:  # a short write (rare on a file): write the rest plainly
            rest = b"".join(bytes(part) for part in parts)[done:]
            while rest:
                rest = rest[os.write(self._fd, rest):]
        self._written += total
        if _start_writeback is not None and self._written - self._written_back >= WRITEBACK_EVERY:
            _start_writeback(self._fd, self._written_back)
            self._written_back = self._written

    def close(self) -> str:
        """End the zlib stream and the pack, write its index, make both durable; returns the blob id."""
        if self._left:
            raise ValueError(f"{self._left} bytes fewer than the {self.size} announced")
        assert self._fd is not None
        self._write_all([struct.pack(">I", self._adler)])
        pack_sha = self._pack_hash.digest()
        self._write_all([pack_sha], in_object=False)
        os.fchmod(self._fd, _read_only_mode())
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        self.oid = self._sha1.hexdigest()
        self._pack_sha = pack_sha
        with open(self.tmp_idx, "xb") as handle:
            handle.write(_index_bytes([(bytes.fromhex(self.oid), self._crc, OBJECT_OFFSET)], pack_sha))
            handle.flush()
            os.fchmod(handle.fileno(), _read_only_mode())
            os.fsync(handle.fileno())
        return self.oid

    @property
    def bytes_written(self) -> int:
        """Bytes of the pack written so far."""
        return self._written

    def place(self) -> None:
        """Give the closed pack, then its index, their names in the store (git sees a pack
        by its index, so it is never seen half there; the same content may be there already)."""
        assert self._pack_sha is not None
        name = f"pack-{self._pack_sha.hex()}"
        os.replace(self.tmp_path, self.pack_dir / f"{name}.pack")
        os.replace(self.tmp_idx, self.pack_dir / f"{name}.idx")

    def abort(self) -> None:
        """Remove the temporary files (nothing was placed)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.tmp_path.unlink(missing_ok=True)
        self.tmp_idx.unlink(missing_ok=True)
