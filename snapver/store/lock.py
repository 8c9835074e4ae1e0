"""The store lock: one writer at a time; a lock of a dead process is free (flock)."""

from __future__ import annotations

import fcntl
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from snapver.errors import StoreLockedError

LOCK_NAME = "snapver.lock"
DEFAULT_WAIT = 5.0


@contextmanager
def store_lock(store_path: Path, wait: float | None = None) -> Iterator[None]:
    """Hold the store's write lock; wait up to ``wait`` seconds, then fail with exit 4.

    ``flock`` is released by the kernel when its holder dies, so a killed snapver never
    leaves a stale lock behind; the holder's pid is written only to name it in errors.
    """
    if wait is None:
        wait = float(os.environ.get("SNAPVER_LOCK_WAIT", DEFAULT_WAIT))
    path = store_path / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + wait
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "another process"
                    raise StoreLockedError(f"the store {store_path} is locked by pid {holder}",
                                           hint="wait for the other snapver command to finish") from None
                time.sleep(0.05)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        os.close(fd)
