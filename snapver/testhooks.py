"""The one place where shipped code reads ``SNAPVER_TEST_*`` to hold a push or rollback.

The integration tests race or SIGKILL a real ``snapver`` process half-way through a
write, so the pause has to come from its environment; the operations themselves only
take callbacks (``ops/run.Pauses``), and the CLI asks here for them. Unset variables
give no callback: nothing is held.

- ``SNAPVER_TEST_PAUSE_AFTER_FILES=N``: after the N-th file sent to a node, sleep
  ``SNAPVER_TEST_PAUSE_SECONDS`` (default an hour) or until interrupted.
- ``SNAPVER_TEST_PAUSE_AFTER_WRITE=SECONDS``: once a node is written, before its health
  check, sleep that long or until interrupted.
- ``SNAPVER_TEST_PAUSE_BEFORE_CONFIG_WRITE=GATE``: `nodes add`/`rm`, before the config
  is compared and replaced: says so in GATE.waiting, then waits for the file GATE.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from snapver import interrupt

PAUSE_AFTER_FILES = "SNAPVER_TEST_PAUSE_AFTER_FILES"
PAUSE_SECONDS = "SNAPVER_TEST_PAUSE_SECONDS"
PAUSE_AFTER_WRITE = "SNAPVER_TEST_PAUSE_AFTER_WRITE"


def pause_after_files() -> Callable[[int], None] | None:
    """A callback for each file sent, holding the write after the N-th; None if unset."""
    count = int(os.environ.get(PAUSE_AFTER_FILES) or 0)
    if not count:
        return None
    seconds = float(os.environ.get(PAUSE_SECONDS) or 3600)

    def sent(number: int) -> None:
        if number == count:
            interrupt.pause(seconds)

    return sent


def pause_after_write() -> Callable[[str], None] | None:
    """A callback for each node written, holding it there; None if unset."""
    value = os.environ.get(PAUSE_AFTER_WRITE)
    if not value:
        return None
    seconds = float(value)
    return lambda node: interrupt.pause(seconds)


PAUSE_BEFORE_CONFIG_WRITE = "SNAPVER_TEST_PAUSE_BEFORE_CONFIG_WRITE"


def pause_before_config_write() -> Callable[[], None] | None:
    """For `nodes add`/`rm`: once the new config is written beside the old, before the
    compare-and-swap, make the file GATE.waiting and wait (at most an hour) until the
    file GATE exists; None if unset."""
    gate = os.environ.get(PAUSE_BEFORE_CONFIG_WRITE)
    if not gate:
        return None

    def hold() -> None:
        import time

        open(f"{gate}.waiting", "w").close()
        deadline = time.monotonic() + 3600
        while not os.path.exists(gate) and time.monotonic() < deadline and not interrupt.requested():
            interrupt.pause(0.02)

    return hold
