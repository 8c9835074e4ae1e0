"""git child processes for the store, each bounded in time: the only place that starts git.

``run_git`` runs one command to its end; ``GitStream`` keeps one that answers requests
(``cat-file --batch``) from hanging. Both start git in a session of its own and kill that
whole session when it runs out of time or the command is interrupted.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from snapver.errors import GitTimeoutError, StoreError, env_seconds

# The longest a git child may take to finish (or, when it streams objects, to answer the
# next one) before it is killed: a damaged store (a loose object turned into a FIFO, a
# pack on a dead mount) must end a command, not hang it. SNAPVER_GIT_TIMEOUT overrides.
DEFAULT_GIT_TIMEOUT = 300.0
GIT_HANG_HINT = ("a file in the store that git cannot read to its end (damage: see `snapver fsck`), or a stalled "
                 "disk; SNAPVER_GIT_TIMEOUT sets the limit")


def git_timeout() -> float:
    """Seconds a git child process is given (``SNAPVER_GIT_TIMEOUT``, default 300)."""
    seconds = env_seconds("SNAPVER_GIT_TIMEOUT", DEFAULT_GIT_TIMEOUT)
    return seconds if seconds > 0 else DEFAULT_GIT_TIMEOUT


def run_git(git_dir: Path, *args: str, input: bytes | None = None,  # noqa: A002 - as subprocess.run
            timeout: float | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run one git command in ``git_dir`` to its end: output captured (stderr too, so it never
    blocks on a full pipe), killed after ``timeout`` (default ``git_timeout()``); ``env``: variables
    added to this process's environment.

    GitTimeoutError when it ran out of time, StoreError when git cannot be started; a git
    that fails is returned as it is (its return code and stderr are the caller's to judge).
    """
    limit = git_timeout() if timeout is None else timeout
    command = ["git", "--git-dir", str(git_dir), *args]
    try:
        # A session of its own: a Ctrl-C at the terminal signals the whole foreground group,
        # and snapver still needs its store while it stops in order (an interrupted push's undo).
        process = subprocess.Popen(command, stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                                   env={**os.environ, **env} if env else None)
    except OSError as exc:
        raise StoreError(f"cannot run git: {exc}") from exc
    try:
        stdout, stderr = process.communicate(input, timeout=limit)
    except subprocess.TimeoutExpired as exc:
        end_process_group(process)
        raise GitTimeoutError(f"git {args[0]} did not finish within {limit:g} s in the store {git_dir}",
                              hint=GIT_HANG_HINT) from exc
    except BaseException:  # an interrupt: git and its children (ssh) go with it
        end_process_group(process)
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def end_process_group(process: subprocess.Popen[bytes]) -> None:
    """Kill a git started in a session of its own with every process of that session (an
    ``ssh`` to the remote would otherwise outlive it, holding its pipes), and reap it."""
    if process.returncode is None:  # not reaped yet: its group id is still its own
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except OSError:
            pass
    process.kill()
    try:
        process.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a descendant that left the session holds the pipes
        process.wait()


def last_line(stderr: bytes | str, fallback: str) -> str:
    """The last non-empty line git wrote on stderr (its error), or ``fallback``."""
    text = stderr.decode("utf-8", "replace") if isinstance(stderr, bytes) else stderr
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else fallback


class GitStream:
    """A long-lived git process read as a stream (``cat-file --batch``), kept from hanging.

    Its stderr is read by a thread as it comes (git writes an error per damaged object: an
    unread pipe fills at 64 KiB and blocks git, and with it our read of its stdout), and a
    watchdog kills it when a request has waited ``timeout`` seconds for its answer. Call
    ``waiting()`` before reading an answer and ``answered()`` after it.
    """

    def __init__(self, git_dir: Path, *args: str, timeout: float | None = None, options: Sequence[str] = ()) -> None:
        self.command = f"git {args[0]}"
        self.timeout = git_timeout() if timeout is None else timeout
        self.timed_out = False
        try:
            self.process = subprocess.Popen(["git", "--git-dir", str(git_dir), *options, *args], stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            start_new_session=True)  # see run_git
        except OSError as exc:
            raise StoreError(f"cannot run git: {exc}") from exc
        self._stderr: deque[bytes] = deque(maxlen=8)  # the last lines are the ones that explain
        self._waiting_since: float | None = None
        self._ended = threading.Event()
        self._drainer = threading.Thread(target=self._drain, daemon=True)
        self._drainer.start()
        threading.Thread(target=self._watch, daemon=True).start()

    @property
    def stdin(self) -> Any:
        return self.process.stdin

    @property
    def stdout(self) -> Any:
        return self.process.stdout

    def alive(self) -> bool:
        return self.process.poll() is None

    def waiting(self) -> None:
        """A request was sent: its answer is due within the timeout."""
        self._waiting_since = time.monotonic()

    def answered(self) -> None:
        """The answer came: nothing is due (an idle process is never killed)."""
        self._waiting_since = None

    def error(self, fallback: str) -> str:
        """Why git stopped: the timeout, else the last line of its stderr, else ``fallback``."""
        if self.timed_out:
            return f"{self.command} did not answer within {self.timeout:g} s"
        return last_line(b"\n".join(self._stderr), fallback)

    def check_time(self) -> None:
        """GitTimeoutError if the watchdog killed the process (a stalled read is not a corrupt object)."""
        if self.timed_out:
            raise GitTimeoutError(f"{self.error('')} in the store",
                                  hint=GIT_HANG_HINT)

    def close(self) -> None:
        """Kill the process and reap it (and the threads that served it)."""
        self._ended.set()
        # Killed first: a feeder thread blocked writing its stdin holds that pipe's lock.
        self._kill()
        self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass  # stdin of a dead git: its buffered bytes have nowhere to go
        self._drainer.join(timeout=5)
        if self.process.stderr is not None:
            self.process.stderr.close()

    def _kill(self) -> None:
        """Kill git and whatever it started (its session), while its group id is still its own."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except OSError:
                self.process.kill()

    def _drain(self) -> None:
        assert self.process.stderr is not None
        try:
            for line in self.process.stderr:
                self._stderr.append(line.rstrip())
        except (OSError, ValueError):
            pass

    def _watch(self) -> None:
        interval = min(0.5, self.timeout / 4)
        while not self._ended.wait(interval):
            since = self._waiting_since
            if since is not None and time.monotonic() - since > self.timeout:
                self.timed_out = True
                self._kill()  # our blocked read then sees end of file
                return
            if self.process.poll() is not None:
                return
