"""Background compaction: compress and delta the stored packs that pulls write, off their path.

Pulls write new blobs uncompressed (see ``pack.py``), so the store grows by the raw
size of new content. Once enough raw bytes have piled up, ``maybe_compact`` starts a
detached ``git repack -a -d -k -F`` that recompresses everything into one pack with
deltas, in bounded memory (``REPACK_CAPS``). ``-k`` keeps objects no ref names yet, so a
pull finishing its commit while the repack runs loses nothing; a second repack never
starts while one runs (flock).
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from snapver.errors import StoreError
from snapver.store.lock import flock_within
from snapver.store.pack import GIT_TEMP_PREFIXES, remove_dead_writers_packs

RAW_BYTES_BEFORE_COMPACT = 32 << 20
# A repack recompresses the whole store: bounded, but far above one git command's limit.
REPACK_TIMEOUT = 3600.0
# The repack's memory, capped (uncapped, it grows with the largest blobs: see
# bench/README.md). Blobs above bigFileThreshold are streamed into the pack and
# never delta-searched: a delta search holds a window of whole objects and their indexes,
# and pack.windowMemory always keeps one object beside the current one, so a 500 MB .so
# would need over 1 GB whatever the window. Smaller blobs are searched within 64 MiB of
# window, on one thread (each thread has its own window), with the computed-delta and
# delta-base caches and the pack files' mmap windows capped too. git maps a loose object
# whole, so big loose blobs (a pull writes its streamed files loose) are first rewritten as
# packs of their own (``_pack_big_loose``), which git reads through these windows.
REPACK_CAPS = {
    "pack.compression": "1",
    "core.bigFileThreshold": "16m",
    "pack.windowMemory": "64m",
    "pack.threads": "1",
    "pack.deltaCacheSize": "16m",
    "core.deltaBaseCacheLimit": "32m",
    "core.packedGitWindowSize": "32m",
    "core.packedGitLimit": "64m",
}
STATE = "snapver/compact.json"
LOCK = "snapver/compact.lock"


def record_raw_bytes(store_path: Path, count: int) -> int:
    """Add ``count`` raw bytes written; returns the total since the last compaction."""
    path = store_path / STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        total = int(json.loads(path.read_text()).get("raw_bytes", 0))
    except (OSError, ValueError):
        total = 0
    total += count
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"raw_bytes": total}))
    os.replace(tmp, path)
    return total


def maybe_compact(store_path: Path) -> int | None:
    """Start a background repack when enough raw bytes piled up; the process id if one started."""
    if os.environ.get("SNAPVER_AUTO_GC", "1") == "0":
        return None
    try:
        total = int(json.loads((store_path / STATE).read_text()).get("raw_bytes", 0))
    except (OSError, ValueError):
        return None
    if total < RAW_BYTES_BEFORE_COMPACT:
        return None
    process = subprocess.Popen([sys.executable, "-m", "snapver.store.gc", str(store_path)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True, close_fds=True)
    return process.pid


# A loose blob at least this big (its file: a pull writes big blobs as stored deflate, so
# about their size) is rewritten as a pack of its own before the repack: bigFileThreshold.
BIG_LOOSE_BYTES = 16 << 20


def _pack_big_loose(store_path: Path) -> int:
    """Rewrite each big loose blob as a one-object pack, then remove the loose file; returns
    how many. The pack is placed before the loose file goes, so the object is never absent;
    a blob that does not read back whole and right is left loose (git's repack reads it)."""
    from snapver.store.blobpack import BlobPack
    from snapver.store.loose import loose_blob_pieces

    objects = store_path / "objects"
    moved = 0
    for folder in objects.glob("[0-9a-f][0-9a-f]"):
        for path in folder.iterdir():
            oid = folder.name + path.name
            try:
                if len(oid) != 40 or path.lstat().st_size < BIG_LOOSE_BYTES:
                    continue
                with open(path, "rb") as handle:
                    head = zlib.decompressobj().decompress(handle.read(64), 64)
            except (OSError, zlib.error):
                continue
            kind, _, rest = head.partition(b" ")
            length = rest.partition(b"\0")[0]
            if kind != b"blob" or not length.isdigit():
                continue
            blob = BlobPack(objects, int(length))
            try:
                with open(path, "rb") as handle:
                    for piece in loose_blob_pieces(handle, oid, 1 << 20):
                        blob.write(piece)
                if blob.close() != oid:
                    raise ValueError(f"{oid} does not read back as itself")
            except (OSError, ValueError, StoreError):
                blob.abort()
                continue
            blob.place()
            path.unlink(missing_ok=True)
            moved += 1
    return moved


@contextmanager
def compaction_paused(store_path: Path, wait: float = 300.0) -> Iterator[None]:
    """No compaction runs meanwhile: one running is waited for (at most ``wait`` seconds:
    then a StoreError), none starts (``compact`` skips when the lock is held). A repack
    deletes the packs it replaced as it ends, under a reader that had them open (fsck
    called such a store damaged). A store this process cannot write has no compaction."""
    try:
        fd = os.open(store_path / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError:
        yield
        return
    try:
        if not flock_within(fd, wait, interval=0.1):
            raise StoreError(f"a compaction of the store has run for over {wait:g} s",
                             hint="try again when it has ended (`snapver/compact.lock` is held)")
        yield
    finally:
        os.close(fd)


def compact(store_path: Path) -> int:
    """Repack the store once (skipped if another compaction holds the lock)."""
    lock_path = store_path / LOCK
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return 0
        try:
            raw_before = int(json.loads((store_path / STATE).read_text()).get("raw_bytes", 0))
        except (OSError, ValueError):
            raw_before = 0
        pack_dir = store_path / "objects" / "pack"
        remove_dead_writers_packs(pack_dir)  # what an earlier, killed compaction left
        _pack_big_loose(store_path)
        before = _git_temps(pack_dir)
        # Low priority: a compaction must never slow the pulls it makes room for.
        os.nice(10)
        try:
            caps = [option for key, value in REPACK_CAPS.items() for option in ("-c", f"{key}={value}")]
            done = subprocess.run(["git", "--git-dir", str(store_path), *caps,
                                   "repack", "-a", "-d", "-k", "-F", "-q"], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=REPACK_TIMEOUT)
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = -1  # run() killed it
        if code == 0:
            record_raw_bytes(store_path, -raw_before)
        else:
            # A failed repack (a full disk) leaves its half-written pack: as big as the store.
            remove_dead_writers_packs(pack_dir, settled=0, only=_git_temps(pack_dir) - before)
        return code
    finally:
        os.close(fd)


def _git_temps(pack_dir: Path) -> set[str]:
    try:
        return {name for name in os.listdir(pack_dir) if name.startswith(GIT_TEMP_PREFIXES)}
    except OSError:
        return set()


if __name__ == "__main__":
    sys.exit(compact(Path(sys.argv[1])))
