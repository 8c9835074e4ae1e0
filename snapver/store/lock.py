"""The store lock: one writer at a time; a lock of a dead process is free (flock)."""

from __future__ import annotations

import errno
import fcntl
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from snapver.errors import StoreError, StoreLockedError, env_seconds

LOCK_NAME = "snapver.lock"
DEFAULT_WAIT = 5.0


def flock_within(fd: int, wait: float, interval: float = 0.05) -> bool:
    """Take ``fd``'s exclusive flock, trying until ``wait`` seconds have passed; False then."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)


@contextmanager
def store_lock(store_path: Path, wait: float | None = None) -> Iterator[None]:
    """Hold the store's write lock; wait up to ``wait`` seconds, then fail with exit 4.

    ``flock`` is released by the kernel when its holder dies, so a killed snapver never
    leaves a stale lock behind; the holder's pid is written only to name it in errors.
    """
    if wait is None:
        wait = env_seconds("SNAPVER_LOCK_WAIT", DEFAULT_WAIT)
    path = store_path / LOCK_NAME
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise unwritable_store(store_path, exc) from exc
    try:
        if not flock_within(fd, wait):
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "another process"
            raise StoreLockedError(f"the store {store_path} is locked by pid {holder}",
                                   hint="wait for the other snapver command to finish")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)


def store_is_locked(store_path: Path) -> bool:
    """True while a command holds the store's write lock (a probe that takes nothing).

    A shared flock, tried and dropped at once: it fails only against a writer's exclusive
    lock, so probes never see each other — two threads probing the same store with
    ``store_lock(wait=0)`` (exclusive, one descriptor each) would each take the other for
    a writer. Read-only: works on a store that cannot be written.
    """
    try:
        fd = os.open(store_path / LOCK_NAME, os.O_RDONLY)
    except OSError:
        return False  # no lock file: no command has ever written this store
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops the shared lock taken, if any
    return False


def unwritable_store(store_path: Path, exc: OSError) -> StoreError:
    """The error for a store that refused a write (read-only, full, not ours): what and why, in words."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EROFS:
        hint = "the store is on a read-only file system: remount it read-write, or point [store] path elsewhere"
    elif exc.errno in (errno.ENOSPC, errno.EDQUOT):
        hint = "free space on the store's disk, then run the command again"
    elif exc.errno in (errno.EACCES, errno.EPERM):
        hint = f"make {store_path} writable for this user (check its permissions and `lsattr` flags)"
    else:
        hint = "nothing was recorded; fix the store's folder and run the command again"
    return StoreError(f"cannot write to the store {store_path}: {reason}", hint=hint)
