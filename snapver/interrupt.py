"""Ctrl-C and SIGTERM: end any command promptly, never leave a node half-written.

The first SIGINT or SIGTERM raises ``Interrupted`` in the main thread and marks the
process interrupted: streams in flight stop at their next piece (a push abandons what it
staged on a node, so nothing is committed there), and connections still busy a moment
later are cut, so that no thread stays blocked waiting for a reply. An operation that
must finish in order (a push undoing what it wrote) holds ``deferred()`` while it does:
its connections are then cut only by itself. A second signal leaves at once.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

# How long streams get to stop by themselves before busy connections are cut.
GRACE = 0.15


class Interrupted(KeyboardInterrupt):
    """Raised in the main thread by SIGINT or SIGTERM (``signum``)."""


class Cuttable(Protocol):
    def cut(self) -> None: ...


_requested = threading.Event()
_signal = [0]
_open: weakref.WeakSet[Any] = weakref.WeakSet()
_deferred = [0]
_guard = threading.Lock()


def install() -> None:
    """Handle SIGINT and SIGTERM this way (call from the main thread)."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _handle)


def requested() -> bool:
    """True once a SIGINT or SIGTERM arrived."""
    return _requested.is_set()


def exit_code() -> int:
    """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
    return 128 + (_signal[0] or signal.SIGINT)


def check() -> None:
    """Raise ``Interrupted`` if a signal arrived (for loops between pieces of work)."""
    if _requested.is_set():
        raise Interrupted()


def pause(seconds: float) -> None:
    """Sleep ``seconds``, or until a signal arrives."""
    _requested.wait(seconds)


def register(connection: Cuttable) -> None:
    """A connection to cut if the command is interrupted while it is busy."""
    with _guard:
        _open.add(connection)


def unregister(connection: Cuttable) -> None:
    with _guard:
        _open.discard(connection)


def cut_all(connections: list[Cuttable] | None = None) -> None:
    """Cut ``connections`` (default: every registered one) without waiting for anything."""
    with _guard:
        targets = list(_open) if connections is None else connections
    for connection in targets:
        try:
            connection.cut()
        except Exception:  # noqa: BLE001 - best effort: the command is ending
            pass


@contextmanager
def deferred() -> Iterator[None]:
    """While held, an interrupt does not cut connections by itself (the holder stops its
    own work in order)."""
    with _guard:
        _deferred[0] += 1
    try:
        yield
    finally:
        with _guard:
            _deferred[0] -= 1


def _handle(signum: int, frame: Any) -> None:
    if _requested.is_set():
        os.write(2, b"snapver: interrupted again: leaving now (`snapver status` shows what is left)\n")
        os._exit(128 + signum)
    _signal[0] = signum
    _requested.set()
    threading.Thread(target=_cut_when_stuck, daemon=True, name="snapver-interrupt").start()
    raise Interrupted()


def _cut_when_stuck() -> None:
    time.sleep(GRACE)
    with _guard:
        if _deferred[0]:
            return
    cut_all()
