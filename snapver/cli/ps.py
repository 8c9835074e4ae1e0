"""`snapver ps [NODE|GROUP...] [--json]`: the processes that run each node's tracked code,
and which need a restart to run what is on disk now."""

from __future__ import annotations

from typing import Any, List

import typer

from snapver.cli.app import app
from snapver.cli.render import console, emit_json, escape, outcome, print_error, show_path
from snapver.cli.state import STATE

FILES_SHOWN = 5  # per process, in the text output (--json has them all, up to the agent's cap)


@app.command()
def ps(
    targets: List[str] = typer.Argument(None, metavar="[NODE|GROUP]...", show_default=False,
                                        help="Nodes or groups (default: every node)."),
    json_out: bool = typer.Option(False, "--json", help="One JSON document on stdout."),
) -> int:
    """The processes running each node's tracked code, and which need a restart.

    Read from /proc on the node: a process that started before a file it may run last
    changed is marked restart needed, with those files.

    Examples:
      snapver ps ct200
      snapver ps tp8 --json
    """
    from snapver.ops.ps import ps as run_ps

    config = STATE.config()
    result = run_ps(config.select(targets or [], all_nodes=not targets))
    outcome(result.exit_code)
    if json_out:
        emit_json(result.to_json())
        return result.exit_code
    render_ps(result)
    return result.exit_code


def started_text(process: Any) -> str:
    """``09:12:03`` today, else ``2026-11-30 09:12``."""
    from datetime import datetime

    if process.started.date() == datetime.now().astimezone().date():
        return f"{process.started:%H:%M:%S}"
    return f"{process.started:%Y-%m-%d %H:%M}"


def render_ps(result: Any) -> None:
    out, err = console(), console(stderr=True)
    for node in result.nodes:
        name = escape(node.node)
        if node.error is not None:
            print_error(node.error)
            continue
        needing = len(node.needing_restart)
        out.print(f"{name}: {len(node.processes)} process(es) run the tracked code"
                  + (f", [red]{needing} need a restart[/red]" if needing else ""))
        for process in node.processes:
            mark = "[red]restart needed[/red]" if process.restart_needed else "[green]current[/green]"
            out.print(f"  {process.pid:>7}  {show_path(process.user)}  started {started_text(process)}  {mark}  "
                      f"{escape(process.command)}")  # escape(): control characters quoted
            for item in process.files[:FILES_SHOWN]:
                how = "old code (replaced .so still mapped)" if item.certain else "may run old code"
                out.print(f"           {show_path(item.path)}: {how}")
            more = len(process.files) - FILES_SHOWN + process.files_more
            if more > 0:
                out.print(f"           and {more} more file(s)")
        for note in node.warnings():
            err.print(f"[yellow]warning[/yellow]: {escape(note)}")
