"""The command line: a thin Typer layer; ``main`` maps every SnapverError to one line."""

from __future__ import annotations

import os
import sys
import traceback

import typer
from typer import Abort

# typer >= 0.27 vendors click and raises its own usage errors; click itself may not be
# installed at all (pyproject pins typer to >=0.27,<0.29).
from typer._click import ClickException

from snapver import interrupt
from snapver.cli.app import app
from snapver.cli.state import STATE
from snapver.errors import SnapverError
from snapver.model import quote_controls

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
        # got what it wanted: the command ends quietly with its result's code (render.outcome:
        # 1 only when differences were found).
        if exc.code == 1 and _stdout_closed():
            sys.exit(STATE.outcome)
        raise
    except SnapverError as exc:
        if interrupt.requested():  # a connection cut by the interrupt failed the command
            print("snapver: interrupted", file=sys.stderr)
            sys.exit(interrupt.exit_code())
        if STATE.verbose:
            traceback.print_exc()
        # A message may hold what a node said: its control characters are quoted.
        print(f"snapver: error: {quote_controls(exc.message)}", file=sys.stderr)
        hint = exc.shown_hint
        if hint:
            print(f"hint: {quote_controls(hint)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except Abort:  # click turns a KeyboardInterrupt (or end of input) at a prompt into Abort
        if sys.stderr.isatty():  # the cursor is still on the prompt's line: leave it first
            print(file=sys.stderr)
        print("snapver: interrupted" if interrupt.requested() else "snapver: aborted", file=sys.stderr)
        sys.exit(interrupt.exit_code())
    except ClickException as exc:  # a usage error: one line and a hint, as every other error
        message = exc.format_message()
        if message:  # none after the help a bare `snapver` (or `snapver patch`) shows instead
            print(f"snapver: error: {quote_controls(message)}", file=sys.stderr)
            context = getattr(exc, "ctx", None)
            print(f"hint: see `{context.command_path if context else 'snapver'} --help`", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("snapver: interrupted", file=sys.stderr)
        sys.exit(interrupt.exit_code())
    except BrokenPipeError as exc:
        if _stdout_closed():  # `snapver log | head`: the reader has all it wanted
            sys.exit(STATE.outcome)
        # A pipe to a helper process (git) broke: a failure, never a silent success.
        print(f"snapver: error: internal error: {exc}", file=sys.stderr)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no raw traceback
        if STATE.verbose:
            traceback.print_exc()
        print(f"snapver: error: internal error: {type(exc).__name__}: {quote_controls(str(exc))}", file=sys.stderr)
        print("hint: run again with -v for the traceback, and report it", file=sys.stderr)
        sys.exit(1)
    if interrupt.requested():  # typer turns a KeyboardInterrupt into a silent exit 130
        print("snapver: interrupted", file=sys.stderr)
        sys.exit(interrupt.exit_code())
    sys.exit(code if isinstance(code, int) else 0)
