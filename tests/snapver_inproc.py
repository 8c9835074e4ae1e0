"""Run the snapver command line inside the test process (no interpreter start-up per call).

``run_inproc(*args)`` drives ``snapver.cli.main`` — the real entry point, with its error
handling and exit codes — and captures stdout/stderr as text, like ``run_snapver``
does for a subprocess. Use it where a test runs many commands; keep ``run_snapver``
where the separate process itself matters (a terminal, signals, the environment).
"""

from __future__ import annotations

import io
import os
import sys

from helpers import Result


def run_inproc(*args: object) -> Result:
    from snapver.cli import main

    streams = [io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="surrogateescape", write_through=True)
               for _ in range(2)]
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = streams
    try:
        main([os.fspath(arg) if isinstance(arg, os.PathLike) else str(arg) for arg in args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdout, sys.stderr = saved
    out, err = (stream.buffer.getvalue().decode("utf-8", "surrogateescape") for stream in streams)
    return Result(code, out, err)
