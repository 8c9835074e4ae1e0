"""A large blob written as a git loose object while it arrives, hashed in the same pass.

A pull's large files (those the node streams in pieces) are never held whole: each piece
is fed to the blob id (SHA-1 of ``blob N\\0`` and the content), the zlib stream's adler32
and the caller's own digests (blake3), and written at once. A loose object is the
cheapest correct container: its zlib stream of stored deflate blocks (as ``pack.py``
writes) needs no crc32 and no pack checksum, so every byte is hashed twice, not four
times; ``git gc`` packs it later, off the pull's path.

The object is written under a temporary name in ``objects/pack`` (the name
``remove_dead_writers_packs`` clears when its writer died) and takes its place in
``objects/xx/`` only when the session that wrote it finishes (``place``).
``open_loose`` and ``loose_blob_pieces`` read a loose blob back a piece at a time
(``Store.blob_chunks``, compaction's ``_pack_big_loose``).
"""

from __future__ import annotations

import hashlib
import os
import queue
import stat
import struct
import threading
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from snapver.errors import StoreError
from snapver.store.pack import (
    STORED_BLOCK,
    TEMP_PREFIX,
    WRITEBACK_EVERY,
    ZLIB_HEADER,
    _read_only_mode,
    _start_writeback,
)


class Digest(Protocol):
    """Anything fed the content as it passes (a blake3 or hashlib object, a counter)."""

    def update(self, data: bytes | memoryview, /) -> object: ...


class StoredBlobFile:
    """A file holding one blob of a size known up front as a zlib stream of stored deflate
    blocks, written piece by piece as it arrives, its git blob id hashed in the same pass.

    The base of the two containers a big blob is written into: a loose object
    (``LooseBlob``) and a pack holding only it (``blobpack.BlobPack``). ``stream_head``:
    bytes the zlib stream holds before the content (a loose object's ``blob N\\0``).
    Subclasses write what precedes the stream, then ``_emit`` its start; ``_account`` sees
    every byte written and ``_after_stream`` writes what follows the stream.
    Content that turns out longer or shorter than ``size`` is refused (ValueError): the
    object would not be the one its id names.
    """

    def __init__(self, tmp_path: Path, size: int, stream_head: bytes = b"") -> None:
        self.tmp_path = tmp_path
        self.size = size
        self.oid: str | None = None
        self._fd: int | None = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        self._written = 0  # bytes of the file
        self._written_back = 0
        self._sha1 = hashlib.sha1(b"blob %d\0" % size, usedforsecurity=False)
        self._adler = zlib.adler32(stream_head)
        self._left = len(stream_head) + size  # bytes of the zlib stream's content still to come
        self._block_left = 0  # of the current stored block

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

    def _account(self, parts: list[bytes | memoryview]) -> None:
        """See the bytes about to be written (a pack hashes them for its index and trailer)."""

    def _after_stream(self) -> None:
        """Write what follows the zlib stream (a pack's checksum)."""

    def _write_all(self, parts: list[bytes | memoryview]) -> None:
        assert self._fd is not None
        self._account(parts)
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
        """End the zlib stream (and what follows it), make the file durable; returns the blob id."""
        if self._left:
            raise ValueError(f"{self._left} bytes fewer than the {self.size} announced")
        assert self._fd is not None
        self._write_all([struct.pack(">I", self._adler)])
        self._after_stream()
        os.fchmod(self._fd, _read_only_mode())
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        self.oid = self._sha1.hexdigest()
        return self.oid

    @property
    def bytes_written(self) -> int:
        """Bytes of the file written so far."""
        return self._written

    def abort(self) -> None:
        """Remove the temporary file (nothing was placed)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        self.tmp_path.unlink(missing_ok=True)


class LooseBlob(StoredBlobFile):
    """One big blob written as a loose object: ``write`` each piece, then ``close`` (which
    returns the blob id); ``place`` puts it into the store, ``abort`` removes it."""

    def __init__(self, objects_dir: Path, size: int) -> None:
        self.objects_dir = objects_dir
        pack_dir = objects_dir / "pack"
        pack_dir.mkdir(parents=True, exist_ok=True)
        header = b"blob %d\0" % size
        super().__init__(pack_dir / f"{TEMP_PREFIX}{os.getpid()}_loose_{id(self):x}", size, header)
        self._emit([ZLIB_HEADER], header)

    def place(self) -> None:
        """Give the closed object its name in the store (it may be there already: same content)."""
        assert self.oid is not None
        folder = self.objects_dir / self.oid[:2]
        folder.mkdir(exist_ok=True)
        os.replace(self.tmp_path, folder / self.oid[2:])


# Pieces handed from the receiving thread to the hashing one, at most: each holds a piece
# alive. Hashing and writing run on a thread of their own (hashlib, zlib, blake3 and writev
# release the GIL on such buffers); more queued pieces gain nothing.
QUEUED_PIECES = 2


def write_loose_blob(objects_dir: Path, size: int, pieces: Iterable[bytes | memoryview],
                     digests: Iterable[Digest] = ()) -> LooseBlob:
    """A closed ``LooseBlob`` of ``pieces`` (each also fed to ``digests``), not placed yet.
    The pieces are hashed and written by a second thread while the next ones arrive. Any
    failure (the pieces' own, a write's) removes the temporary file and is raised."""
    also = list(digests)
    blob = LooseBlob(objects_dir, size)
    handoff: queue.Queue[bytes | memoryview | None] = queue.Queue(QUEUED_PIECES)
    failed: list[BaseException] = []

    def hash_and_write() -> None:
        while (piece := handoff.get()) is not None:
            if failed:
                continue  # drain: the receiving side stops at its next piece
            try:
                blob.write(piece)
                for digest in also:
                    digest.update(piece)
            except BaseException as exc:  # noqa: BLE001 - raised again by the receiving thread
                failed.append(exc)

    worker = threading.Thread(target=hash_and_write, name="snapver-loose-blob", daemon=True)
    worker.start()
    try:
        try:
            for piece in pieces:
                if failed:
                    break
                handoff.put(piece)
        finally:
            handoff.put(None)
            worker.join()
        if failed:
            raise failed[0]
        blob.close()
    except BaseException:
        blob.abort()
        raise
    return blob


def open_loose(path: Path) -> BinaryIO | None:
    """A loose object's file, if it is a plain file (a FIFO in its place would block the open
    and every read: left to git, which the watchdog stops); None when packed or missing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return os.fdopen(fd, "rb")


def loose_blob_pieces(handle: BinaryIO, oid: str, chunk: int) -> Iterator[bytes]:
    """A loose object's blob content (zlib of ``blob SIZE\\0`` + content), inflated in pieces
    of at most ``chunk`` bytes; a damaged or non-blob object is a StoreError."""
    damaged = StoreError(f"object {oid} in the store is corrupt", hint="run `snapver fsck`")
    inflate = zlib.decompressobj()
    header = b""
    size = left = -1
    pending = b""
    try:
        while True:
            if not pending:
                pending = handle.read(1 << 20)
                if not pending:
                    break
            piece = inflate.decompress(pending, chunk)
            pending = inflate.unconsumed_tail
            if size < 0:
                header += piece
                end = header.find(b"\0")
                if end < 0:
                    if len(header) > 32:
                        raise damaged
                    continue
                kind, _, length = header[:end].partition(b" ")
                if kind != b"blob" or not length.isdigit():
                    raise damaged
                size = left = int(length)
                piece = header[end + 1:]
            if len(piece) > left:
                raise damaged
            left -= len(piece)
            if piece:
                yield piece
            if inflate.eof:
                break
    except zlib.error as exc:
        raise damaged from exc
    if left != 0 or not inflate.eof:
        raise damaged
