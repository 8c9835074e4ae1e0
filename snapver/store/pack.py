"""A streaming writer of git packfiles (v2 pack + v2 index) for new objects.

Why not ``git fast-import`` or loose objects: fast-import hashes and compresses on one
thread, and thousands of loose objects cost a syscall storm. One sequential pack with stored (level-0) zlib streams is
written at memory speed; ``git gc`` compresses it later, off the pull's path.

Each record's zlib stream is made of stored deflate blocks written straight from the
caller's buffer (no compressed copy), and the kernel is asked to start writing the pack
out as it grows, so the ``fsync`` that ends it has little left to wait for.

A pack becomes visible to git only when its ``.idx`` is renamed into place, after the
``.pack`` is complete and on disk; an interrupted writer leaves only a ``tmp_pack_*`` file.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import time
import zlib
from pathlib import Path

COMMIT_TYPE, TREE_TYPE, BLOB_TYPE = 1, 2, 3
TYPE_NAMES = {COMMIT_TYPE: b"commit", TREE_TYPE: b"tree", BLOB_TYPE: b"blob"}
TEMP_PREFIX = "tmp_pack_snapver_"
ZLIB_HEADER = b"\x78\x01"  # deflate, 32 KiB window, "fastest" level; (0x7801 % 31 == 0)
STORED_BLOCK = 0xFFFF  # the most a stored deflate block holds
BUFFER = 1 << 16
WRITEBACK_EVERY = 8 << 20  # bytes written between two requests to start writing back
HASH_CHUNK = 1 << 20  # the pack re-read for its checksum, a mapped window at a time (8 MiB: +7 MiB of peak)


def object_id(kind: int, data: bytes | bytearray | memoryview) -> bytes:
    """The binary git id of an object of type ``kind`` holding ``data``."""
    digest = hashlib.sha1(b"%s %d\0" % (TYPE_NAMES[kind], len(data)), usedforsecurity=False)
    digest.update(data)
    return digest.digest()


# git's own temporaries in objects/pack (pack-objects under `git repack`, index-pack under
# `git fetch`): a repack that hits a full disk leaves its half-written `tmp_pack_XXXXXX`.
GIT_TEMP_PREFIXES = ("tmp_pack_", "tmp_idx_")
# A git temporary untouched this long, and open in no process, has no writer left (git
# closes a pack before writing its index, so "not open" alone could be a live writer).
GIT_TEMP_SETTLED = 60.0


def remove_dead_writers_packs(pack_dir: Path, settled: float = GIT_TEMP_SETTLED,
                              only: set[str] | None = None) -> list[str]:
    """Delete the temporary packs of writers that died (SIGKILL, power loss, a full disk).

    Ours carry the writer's pid: a pack of a live process is left alone. git's (a failed
    compaction's ``tmp_pack_*``) are removed when no process has them open and they were
    not modified for ``settled`` seconds; ``only`` limits that to the names given. Returns
    the names removed.
    """
    removed = []
    git_temps = []
    for path in pack_dir.iterdir() if pack_dir.is_dir() else ():
        name = path.name
        if name.startswith(TEMP_PREFIX):
            try:
                pid = int(name[len(TEMP_PREFIX):].split("_")[0])
                os.kill(pid, 0)
            except ProcessLookupError:
                path.unlink(missing_ok=True)
                removed.append(name)
            except (ValueError, PermissionError, OSError):
                continue
        elif name.startswith(GIT_TEMP_PREFIXES) and (only is None or name in only):
            git_temps.append(path)
    if git_temps:
        in_use = _files_open_in(pack_dir)
        real_dir = pack_dir.resolve()
        if in_use is None:
            return removed  # no /proc: which writer lives cannot be told, so none is removed
        now = time.time()
        for path in git_temps:
            try:
                if str(real_dir / path.name) in in_use or now - path.stat().st_mtime < settled:
                    continue
                path.unlink()
            except OSError:
                continue
            removed.append(path.name)
    return removed


def _files_open_in(folder: Path) -> set[str] | None:
    """Paths under ``folder`` that some process has open (read from /proc), or None without /proc."""
    proc = Path("/proc")
    if not (proc / "self" / "fd").is_dir():
        return None
    prefix = str(folder.resolve()) + "/"
    found = set()
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        fd_dir = f"/proc/{entry.name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue  # gone, or not ours to read
        for fd in fds:
            try:
                target = os.readlink(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if target.startswith(prefix):
                found.add(target)
    return found


def current_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` would, for every thread)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def _read_only_mode() -> int:
    """0o444 less the umask, as git makes its packs."""
    return 0o444 & ~current_umask()


def _object_header(kind: int, size: int) -> bytes:
    byte = (kind << 4) | (size & 0x0F)
    size >>= 4
    out = bytearray()
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def stored_zlib(data: bytes | bytearray | memoryview) -> list[bytes | memoryview]:
    """``data`` as a zlib stream of stored (uncompressed) deflate blocks, in pieces.

    What ``zlib.compress(data, 0)`` returns, without copying ``data``: the 2-byte zlib
    header, one 5-byte header per block of at most 65,535 bytes (the last one marked
    final; an empty ``data`` is one empty final block), the data, and the adler32.
    """
    view = memoryview(data).cast("B")
    size = len(view)
    pieces: list[bytes | memoryview] = [ZLIB_HEADER]
    start = 0
    while True:
        length = min(STORED_BLOCK, size - start)
        final = start + length >= size
        pieces.append(struct.pack("<BHH", final, length, length ^ 0xFFFF))
        if length:
            pieces.append(view[start:start + length])
        if final:
            break
        start += length
    pieces.append(struct.pack(">I", zlib.adler32(view)))
    return pieces


def _writeback_starter():
    """``sync_file_range(fd, offset, 0, SYNC_FILE_RANGE_WRITE)``: start writing a file's
    pages out without waiting (git does the same for ``core.fsyncMethod=batch``).
    None where the C library has no such call; the final ``fsync`` is what guarantees."""
    try:
        import ctypes

        call = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    return lambda fd, offset: call(fd, offset, 0, 2)


_start_writeback = _writeback_starter()


class PackWriter:
    """Append objects to a new pack; ``finish`` writes the index and makes it visible.

    The pack's checksum covers its header, which holds the object count, known only at
    the end: ``finish`` reads the pack back to compute it (hashing as objects are written,
    with a count promised up front, saves nothing on small machines).
    """

    def __init__(self, objects_dir: Path) -> None:
        self.pack_dir = objects_dir / "pack"
        self.pack_dir.mkdir(parents=True, exist_ok=True)
        remove_dead_writers_packs(self.pack_dir)
        self.tmp_path = self.pack_dir / f"{TEMP_PREFIX}{os.getpid()}_{id(self):x}"
        self._tmp_idx = self.pack_dir / f"{self.tmp_path.name}_idx"
        self._file = open(self.tmp_path, "w+b", buffering=BUFFER)  # read back in finish()
        self._written_back = 0
        self._entries: list[tuple[bytes, int, int]] = []  # (binary oid, crc32, offset)
        self._file.write(b"PACK" + struct.pack(">II", 2, 0))  # count fixed in finish()
        self._offset = 12

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._offset

    def add(self, oid: str | bytes, data: bytes | bytearray | memoryview, kind: int = BLOB_TYPE) -> None:
        """Append one object whose git id is ``oid`` (hex or binary; the caller has checked it)."""
        pieces = [_object_header(kind, len(data)), *stored_zlib(data)]
        crc = 0
        length = 0
        for piece in pieces:
            crc = zlib.crc32(piece, crc)
            self._file.write(piece)
            length += len(piece)
        self._entries.append((oid if isinstance(oid, bytes) else bytes.fromhex(oid), crc, self._offset))
        self._offset += length
        if _start_writeback is not None and self._offset - self._written_back >= WRITEBACK_EVERY:
            self._file.flush()
            _start_writeback(self._file.fileno(), self._written_back)
            self._written_back = self._offset

    def abort(self) -> None:
        try:
            self._file.close()  # flushes what the buffer holds: may fail as the write did (disk full)
        except OSError:
            pass
        self.tmp_path.unlink(missing_ok=True)
        self._tmp_idx.unlink(missing_ok=True)

    def finish(self) -> Path | None:
        """Complete the pack and its index; returns the pack path (None if empty)."""
        if not self._entries:
            self.abort()
            return None
        self._file.seek(8)
        self._file.write(struct.pack(">I", len(self._entries)))
        self._file.flush()
        pack_sha = _file_sha1(self._file.fileno(), self._offset)
        self._file.seek(self._offset)
        self._file.write(pack_sha)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        name = f"pack-{pack_sha.hex()}"
        # The index is complete on disk before either file takes its final name, so a
        # writer killed here leaves temporary files (cleared by the next writer), at worst
        # a lone .pack, never an index without its pack.
        tmp_idx = self._tmp_idx
        with open(tmp_idx, "wb") as handle:
            handle.write(_index_bytes(self._entries, pack_sha))
            handle.flush()
            os.fsync(handle.fileno())
        final_pack = self.pack_dir / f"{name}.pack"
        for path in (self.tmp_path, tmp_idx):
            os.chmod(path, _read_only_mode())
        os.replace(self.tmp_path, final_pack)
        os.replace(tmp_idx, self.pack_dir / f"{name}.idx")
        return final_pack


def _file_sha1(fd: int, length: int) -> bytes:
    """SHA-1 of the first ``length`` bytes of a file, read through mappings (no copies), one
    window at a time: mapped pages count as this process's memory while they are mapped."""
    digest = hashlib.sha1(usedforsecurity=False)
    for start in range(0, length, HASH_CHUNK):
        with mmap.mmap(fd, min(HASH_CHUNK, length - start), access=mmap.ACCESS_READ, offset=start) as window:
            digest.update(window)
    return digest.digest()


def _index_bytes(entries: list[tuple[bytes, int, int]], pack_sha: bytes) -> bytes:
    """A version-2 pack index for ``entries`` (git's ``Documentation/gitformat-pack``)."""
    ordered = sorted(entries)
    fanout = [0] * 256
    for oid, _, _ in ordered:
        fanout[oid[0]] += 1
    running = 0
    for i in range(256):
        running += fanout[i]
        fanout[i] = running
    small_offsets = bytearray()
    large_offsets = bytearray()
    for _, _, offset in ordered:
        if offset < 0x80000000:
            small_offsets += struct.pack(">I", offset)
        else:
            small_offsets += struct.pack(">I", 0x80000000 | (len(large_offsets) // 8))
            large_offsets += struct.pack(">Q", offset)
    body = b"".join([
        b"\377tOc", struct.pack(">I", 2), struct.pack(">256I", *fanout),
        b"".join(oid for oid, _, _ in ordered),
        b"".join(struct.pack(">I", crc) for _, crc, _ in ordered),
        bytes(small_offsets), bytes(large_offsets), pack_sha,
    ])
    return body + hashlib.sha1(body, usedforsecurity=False).digest()
