"""A streaming writer of git packfiles (v2 pack + v2 index) for new blobs.

Why not ``git fast-import`` or loose objects: on small cores fast-import spends ~2 s
hashing and compressing the 84 MB sglang tree on one thread, and 2,600 loose objects
cost ~1 s of syscalls. One sequential pack with stored (level-0) zlib streams is
written at memory speed; ``git gc`` compresses it later, off the pull's path.

A pack becomes visible to git only when its ``.idx`` is renamed into place, after the
``.pack`` is complete; an interrupted writer leaves only a ``tmp_pack_*`` file.
"""

from __future__ import annotations

import hashlib
import os
import struct
import zlib
from pathlib import Path

BLOB_TYPE = 3
LEVEL = 0  # stored deflate: see the module docstring
TEMP_PREFIX = "tmp_pack_snapver_"


def remove_dead_writers_packs(pack_dir: Path) -> None:
    """Delete the temporary packs of writers that died (SIGKILL, power loss) before finishing.

    Their names carry the writer's pid; a pack of a live process is left alone.
    """
    for path in pack_dir.glob(TEMP_PREFIX + "*"):
        try:
            pid = int(path.name[len(TEMP_PREFIX):].split("_")[0])
            os.kill(pid, 0)
        except ProcessLookupError:
            path.unlink(missing_ok=True)
        except (ValueError, PermissionError, OSError):
            continue


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


class PackWriter:
    """Append blobs to a new pack; ``finish`` writes the index and makes it visible."""

    def __init__(self, objects_dir: Path) -> None:
        self.pack_dir = objects_dir / "pack"
        self.pack_dir.mkdir(parents=True, exist_ok=True)
        remove_dead_writers_packs(self.pack_dir)
        self.tmp_path = self.pack_dir / f"{TEMP_PREFIX}{os.getpid()}_{id(self):x}"
        self._file = open(self.tmp_path, "wb")
        self._file.write(b"PACK" + struct.pack(">II", 2, 0))  # count fixed in finish()
        self._offset = 12
        self._entries: list[tuple[bytes, int, int]] = []  # (binary oid, crc32, offset)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self._offset

    def add(self, oid: str, data: bytes) -> None:
        """Append one blob whose git id is ``oid`` (the caller has checked it)."""
        record = _object_header(BLOB_TYPE, len(data)) + zlib.compress(data, LEVEL)
        self._file.write(record)
        self._entries.append((bytes.fromhex(oid), zlib.crc32(record), self._offset))
        self._offset += len(record)

    def abort(self) -> None:
        self._file.close()
        self.tmp_path.unlink(missing_ok=True)

    def finish(self) -> Path | None:
        """Complete the pack and its index; returns the pack path (None if empty)."""
        if not self._entries:
            self.abort()
            return None
        self._file.seek(8)
        self._file.write(struct.pack(">I", len(self._entries)))
        self._file.close()
        digest = hashlib.sha1(usedforsecurity=False)
        with open(self.tmp_path, "r+b") as handle:
            while chunk := handle.read(1 << 22):
                digest.update(chunk)
            pack_sha = digest.digest()
            handle.write(pack_sha)
            handle.flush()
            os.fsync(handle.fileno())
        name = f"pack-{pack_sha.hex()}"
        final_pack = self.pack_dir / f"{name}.pack"
        os.chmod(self.tmp_path, _read_only_mode())
        os.replace(self.tmp_path, final_pack)
        index = _index_bytes(self._entries, pack_sha)
        tmp_idx = self.pack_dir / f"tmp_idx_{name}"
        with open(tmp_idx, "wb") as handle:
            handle.write(index)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp_idx, _read_only_mode())
        os.replace(tmp_idx, self.pack_dir / f"{name}.idx")
        return final_pack


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
