"""The command line: a thin Typer layer; ``main`` maps every SnapverError to one line."""

from __future__ import annotations

import gc
import os
import sys
import traceback

import typer
from typer import Abort
# typer >= 0.27 vendors click and raises its own usage errors; click itself may not be
# installed at all (pyproject pins typer to >=0.27,<0.29).
from typer._click import ClickException

from snapver import interrupt
from snapver.cli.app import STATE, app
from snapver.errors import SnapverError

# The modules that register commands on ``app`` are imported when their command is asked
# for (see COMMANDS in cli/app.py); operations are imported inside the commands.


def _stdout_closed() -> bool:
    """True when whoever reads our stdout has gone (a pipe reports POLLERR then)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(events & select.POLLERR for _, events in poller.poll(0))
    except (OSError, ValueError):
        return False


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app, print errors as one line, exit with their code."""
    arguments = sys.argv[1:] if argv is None else argv
    if "--no-color" in arguments[:arguments.index("--") if "--" in arguments else None]:
        os.environ["NO_COLOR"] = "1"  # also for what prints before our options are read (--help)
    command = typer.main.get_command(app)
    try:
        code = command.main(args=argv, prog_name="snapver", standalone_mode=False)
    except SystemExit as exc:
        # typer turns a BrokenPipeError on stdout into a silent exit 1; `snapver log | head`
        # got what it wanted: the command ends quietly, 0 (SPEC: 1 means differences found).
        if exc.code == 1 and _stdout_closed():
            sys.exit(0)
        raise
    except SnapverError as exc:
        if interrupt.requested():  # a connection cut by the interrupt failed the command
            print("snapver: interrupted", file=sys.stderr)
            sys.exit(interrupt.exit_code())
        if STATE.verbose:
            traceback.print_exc()
        print(f"snapver: error: {exc.message}", file=sys.stderr)
        hint = exc.shown_hint
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except Abort:  # click turns a KeyboardInterrupt (or end of input) at a prompt into Abort
        if sys.stderr.isatty():  # the cursor is still on the prompt's line: leave it first
            print(file=sys.stderr)
        print("snapver: interrupted" if interrupt.requested() else "snapver: aborted", file=sys.stderr)
        sys.exit(interrupt.exit_code())
    except ClickException as exc:  # a usage error: one line and a hint, as every other error
        message = exc.format_message()
        if message:  # none after the help a bare `snapver` (or `snapver patch`) shows instead
            print(f"snapver: error: {message}", file=sys.stderr)
            context = getattr(exc, "ctx", None)
            print(f"hint: see `{context.command_path if context else 'snapver'} --help`", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("snapver: interrupted", file=sys.stderr)
        sys.exit(interrupt.exit_code())
    except BrokenPipeError as exc:
        if _stdout_closed():  # `snapver log | head`: the reader has all it wanted
            sys.exit(0)
        # A pipe to a helper process (git) broke: a failure, never a silent success.
        print(f"snapver: error: internal error: {exc}", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no raw traceback
        if STATE.verbose:
            traceback.print_exc()
        print(f"snapver: error: internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        print("hint: run again with -v for the traceback, and report it", file=sys.stderr)
        sys.exit(1)
    if interrupt.requested():  # typer turns a KeyboardInterrupt into a silent exit 130
        print("snapver: interrupted", file=sys.stderr)
        sys.exit(interrupt.exit_code())
    sys.exit(code if isinstance(code, int) else 0)


def _open_closed_standard_streams() -> None:
    """A standard stream closed by the caller (`snapver log >&-`) becomes /dev/null: Python
    left it None (a traceback at the first print), and the next file opened would have taken
    its descriptor (the store's lock file as stdout)."""
    for fd, name, mode in ((0, "stdin", "r"), (1, "stdout", "w"), (2, "stderr", "w")):
        try:
            os.fstat(fd)
        except OSError:
            if os.open(os.devnull, os.O_RDWR) != fd:  # the lowest free descriptor: this one
                continue
            setattr(sys, name, open(fd, mode, encoding="utf-8", errors="surrogateescape", closefd=False))


def run() -> None:
    """The ``snapver`` program: ``main``, then leave without the interpreter's teardown.

    Freeing every object of a big pull took 70-150 ms after the work was done. By the time
    ``main`` returns, every file it wrote is closed, the store lock released and its threads
    joined (those left are daemons), so only the standard streams need flushing.
    (``main`` itself returns normally, for callers running it in their own process.)

    The cyclic garbage collector is off: a command lives seconds, reference counting
    frees nearly everything, and what is left in cycles is freed at exit. Listings of
    thousands of rows per node made it run hundreds of times, over every object: 45 ms
    of a one-node pull, 200-280 ms of a 16-node pull, 460 ms of a 16-node re-pull.
    """
    gc.disable()
    _open_closed_standard_streams()
    _keep_freed_memory()
    interrupt.install()
    try:
        main()
        code = 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away; a stream already closed
            pass
    os._exit(code)


def _keep_freed_memory() -> None:
    """Have glibc's malloc keep the memory a command frees, for its next allocations.

    By default each buffer over 128 KiB (a file's content, a decompressed piece of a
    stream) is a fresh mapping returned to the kernel when freed, so the next one faults
    in every page again: 70,000-95,000 page faults in a one-node first pull, ~0.1 s of
    kernel time; 40,000 with these settings. A command lives seconds; what it frees
    goes back to the system at exit. Elsewhere than glibc this does nothing.
    """
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ImportError, OSError, AttributeError):
        return
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -2, -3, -8
    mallopt(M_MMAP_THRESHOLD, 256 << 20)  # up to 256 MiB from the heap, not its own mapping
    mallopt(M_TRIM_THRESHOLD, 1 << 30)  # never give the heap's top back during the run
    mallopt(M_TOP_PAD, 64 << 20)  # and grow it in 64 MiB steps
    # One heap for every thread: a pull's threads (SSH reader, hashing, per node) each had
    # an arena of their own, whose freed buffers no other thread could reuse: a 1.14 GB
    # first pull of torch peaked at ~105 MiB, ~97 MiB with one (no slower, 4 runs each).
    mallopt(M_ARENA_MAX, 1)
