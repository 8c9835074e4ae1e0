"""`snapver ps [NODE|GROUP...] [--json]`: the processes that run each node's tracked code,
and which need a restart to run what is on disk now."""

from __future__ import annotations

from typing import Any

from snapver.cli.app import app
from snapver.cli.fit import print_beside
from snapver.cli.options import JsonOpt, NodesArg
from snapver.cli.render import console, emit_json, escape, outcome, print_error, show_path
from snapver.cli.state import STATE

FILES_SHOWN = 5  # per process, in the text output (--json has them all, up to the agent's cap)
INDENT = " " * 11  # a process's files, under its command


@app.command()
def ps(
    targets: NodesArg = None,
    json_out: JsonOpt = False,
) -> int:
    """The processes running each node's tracked code, and which need a restart.

    Read from /proc on the node, by what each process runs (its interpreter, the files of
    the tree it maps or holds open), so renamed processes are listed; snapver's own are
    not. A process is marked restart needed when a module it may run differs, by
    content, from what it held when the process started (the node's snapshot from then;
    without one, a file changed since it started), or was added or removed since.
    Exit 1 when any process needs a restart, 0 otherwise (as diff).

    Examples:
      snapver ps ct200
      snapver ps tp8 --json
    """
    from snapver.ops.ps import ps as run_ps

    config = STATE.config()
    store = STATE.store(config) if (config.store_path / "HEAD").exists() else None
    result = run_ps(config.select(targets or [], all_nodes=not targets), store)
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


def file_verdict(item: Any) -> str:
    """What one file means for a process, in a few words."""
    if item.same_content:
        return "replaced by the same bytes (old copy still mapped): no restart needed"
    if item.certain:
        return "old code (replaced .so still mapped)"
    if item.why.startswith(("added", "removed")):
        return f"{item.why.split(':')[0]}: may run old code"
    return "may run old code"


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
            print_beside(out, f"  {process.pid:>7}  {show_path(process.user)}  started {started_text(process)}  {mark}",
                         escape(process.command), "  ")  # escape(): control characters quoted
            for item in process.files[:FILES_SHOWN]:
                print_beside(out, f"{INDENT}{show_path(item.path)}:", escape(file_verdict(item)), " ")
            more = len(process.files) - FILES_SHOWN + process.files_more
            if more > 0:
                out.print(f"{INDENT}and {more} more file(s)")
        for note in node.warnings():
            err.print(f"[yellow]warning[/yellow]: {escape(note)}")
