"""The ``snapver`` program: set the process up, begin a pull's connections, then load the
command line (``snapver.cli.main``).

Connecting first is ``snapver.transport.prestart``'s: a pull's nodes are connecting while
Typer and the CLI are imported.
"""

from __future__ import annotations

import gc
import os
import sys

from snapver import interrupt
from snapver.transport.prestart import prestart


def run() -> None:
    """The ``snapver`` program: set the process up, ``prestart``, the command line
    (``snapver.cli.main``), then leave without the interpreter's teardown.

    The set-up comes first: a connection begun before it would take a closed standard
    stream's descriptor, and its threads would each get a malloc arena of their own.

    Freeing every object of a big pull is time spent after the work is done. By the time
    ``main`` returns, every file it wrote is closed, the store lock released and its threads
    joined (those left are daemons), so only the standard streams need flushing.
    (``main`` itself returns normally, for callers running it in their own process.)

    The cyclic garbage collector is off: a command lives seconds, reference counting
    frees nearly everything, and what is left in cycles is freed at exit; listings of
    thousands of rows per node would make it run hundreds of times, over every object.
    """
    gc.disable()
    _open_closed_standard_streams()
    _keep_freed_memory()
    interrupt.install()
    prestart(sys.argv[1:])
    from snapver.cli import main

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


def _keep_freed_memory() -> None:
    """Have glibc's malloc keep the memory a command frees, for its next allocations.

    By default each buffer over 128 KiB (a file's content, a decompressed piece of a
    stream) is a fresh mapping returned to the kernel when freed, so the next one faults
    in every page again. A command lives seconds; what it frees
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
    # One heap for every thread: with an arena per thread (SSH reader, hashing, per node)
    # no thread could reuse the buffers another freed.
    mallopt(M_ARENA_MAX, 1)
