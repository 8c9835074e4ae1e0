"""Run snapver in a real pseudo-terminal of a given size (for the pager, tables, Ctrl-C).

Independent of snapver: a pty from the standard library, its window size set with
TIOCSWINSZ (what rich and `shutil.get_terminal_size` read), everything the program
writes to the terminal (stdout and stderr both) read back.
"""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Screen:
    """What a run wrote to its terminal (``\\r\\n`` turned back to ``\\n``) and its exit code."""

    code: int
    text: str


def terminal_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The test's environment for a terminal run: colours allowed, no COLUMNS/LINES (the pty's size rules)."""
    full = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
            "TERM": "xterm-256color"}
    for name in ("NO_COLOR", "COLUMNS", "LINES", "FORCE_COLOR"):
        full.pop(name, None)
    full.update(env or {})
    return full


def run_in_terminal(*args: str, columns: int = 80, rows: int = 24, env: Mapping[str, str] | None = None,
                    cwd: Path | None = None, interrupt_after: float | None = None,
                    interrupt_on: bytes | None = None, settle: float = 0.0, timeout: float = 120,
                    replies: Sequence[tuple[bytes, bytes | Callable[[], bytes]]] = ()) -> Screen:
    """``python -m snapver ARGS`` with stdin, stdout and stderr on a new pty of ``columns`` x ``rows``.

    ``interrupt_after``: seconds after which Ctrl-C is typed (SIGINT to the process group);
    ``interrupt_on``: typed ``settle`` seconds after these bytes were written to the terminal
    (a signal that comes before a program blocks reading the terminal waits for the next key).
    ``replies``: (prompt, keys) in order: each ``keys`` is typed once its ``prompt`` was written
    after the previous reply (the terminal holds typed lines until the program reads them);
    a callable ``keys`` is called then (to act while the program waits) and gives the keys.
    """
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    process = subprocess.Popen([sys.executable, "-m", "snapver", *args], cwd=cwd, env=terminal_env(env),
                               stdin=slave, stdout=slave, stderr=slave, start_new_session=True)
    os.close(slave)
    output = bytearray()
    deadline = time.monotonic() + timeout
    sent = interrupt_after is None and interrupt_on is None
    started = time.monotonic()
    seen: float | None = None
    pending, looked_from = list(replies), 0
    try:
        while time.monotonic() < deadline:
            if pending and pending[0][0] in output[looked_from:]:
                prompt, keys = pending.pop(0)
                looked_from = output.index(prompt, looked_from) + len(prompt)
                os.write(master, keys() if callable(keys) else keys)
            if seen is None and interrupt_on is not None and interrupt_on in output:
                seen = time.monotonic()
            if not sent and ((interrupt_after is not None and time.monotonic() - started >= interrupt_after)
                             or (seen is not None and time.monotonic() - seen >= settle)):
                os.killpg(process.pid, signal.SIGINT)
                sent = True
            ready, _, _ = select.select([master], [], [], 0.05)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every writer has closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            elif process.poll() is not None and not ready:
                # Drain what is left, then stop.
                while select.select([master], [], [], 0.05)[0]:
                    try:
                        chunk = os.read(master, 65536)
                    except OSError:
                        break
                    if not chunk:
                        break
                    output += chunk
                break
        code = process.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if process.poll() is None:
            process.kill()
        os.close(master)
    return Screen(code, output.decode("utf-8", "replace").replace("\r\n", "\n"))
