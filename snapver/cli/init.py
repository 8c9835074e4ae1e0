"""`snapver init`: parse, call one operation, render."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from snapver.cli.app import app
from snapver.cli.options import JsonOpt
from snapver.cli.render import console, emit_json, escape
from snapver.cli.state import STATE


@app.command()
def init(
    local: bool = typer.Option(False, "--local", help="Add node `local`: this Python's site-packages, no SSH."),
    writer: str | None = typer.Option(None, "--writer", metavar="NAME",
                                         help="This store's writer id for `snapver sync` (default: user@host); "
                                              "on an existing store, changes it."),
    json_out: JsonOpt = False,
) -> int:
    """Create `.snapver` (from the example) and an empty store here; it names no node unless --local.

    With --config (or $SNAPVER_CONFIG), that file is the one written (or kept) and its store made.

    Examples:
      snapver init            # then add your nodes to .snapver
      snapver init --local    # this machine's site-packages as node `local`
      snapver init --writer alice@lab   # its name on a team remote
    """
    from snapver.config import ENV_CONFIG
    from snapver.ops.init import init as run_init

    # The config named by --config or $SNAPVER_CONFIG is the one made (or kept) and whose
    # store is created, as every other command would read it; else `.snapver` here.
    named = STATE.config_path or os.environ.get(ENV_CONFIG)
    result = run_init(Path.cwd(), local=local, writer=writer, config_path=Path(named) if named else None)
    if json_out:
        emit_json({"config": str(result.config_path), "config_created": result.config_created,
                   "store": str(result.store_path), "local": local, "writer": result.writer, "exit_code": 0})
        return 0
    out = console()
    if result.config_created:
        out.print(f"wrote {escape(str(result.config_path))} "
                  + ("(node `local`: this Python's site-packages)" if local else "(edit it to add your nodes)"))
    else:
        out.print(f"kept the existing {escape(str(result.config_path))}")
    out.print(f"store ready at {escape(str(result.store_path))}"
              + (f" (writer {escape(result.writer)})" if writer is not None else ""))
    return 0
