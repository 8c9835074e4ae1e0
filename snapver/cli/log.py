"""`snapver log`: parse, call one operation, render."""

from __future__ import annotations

import sys
from typing import Any

import typer

from snapver.cli.app import PATHS_KEY, PathsAfterDashes, app
from snapver.cli.options import JsonOpt
from snapver.cli.render import console, emit_json, escape, fields_line, show_list, show_path
from snapver.cli.state import STATE


class NodeThenPathsCommand(PathsAfterDashes):
    usage = "[NODE] [-- PATH...]"


@app.command(cls=NodeThenPathsCommand)
def log(
    ctx: typer.Context,
    node: str | None = typer.Argument(None, help="Only this node's snapshots (or a group's, or a range's). "
                                      "Paths go after `--`: only the snapshots where they changed."),
    limit: int | None = typer.Option(None, "-n", help="At most N snapshots.", min=1),
    since: str | None = typer.Option(None, "--since", metavar="DATE",
                                        help="Only snapshots taken on or after DATE (2026-05-22, may22, ISO time)."),
    oneline: bool = typer.Option(False, "--oneline", help="One short line per snapshot: id, date, node, event."),
    patch: bool = typer.Option(False, "-p", "--patch", help="Each snapshot's diff from the one before it."),
    stat: bool = typer.Option(False, "--stat", help="Each snapshot's diffstat from the one before it."),
    json_out: JsonOpt = False,
) -> int:
    """Snapshots, newest first: id, date, node, what made it, files changed, tags, version.

    What made it: pull, push NAME, rollback or import; the message follows.

    Examples:
      snapver log ct200 -n 5
      snapver log --since may22 --oneline
      snapver log ct200 -p -- cuda_graph_runner.py
    """
    from snapver.errors import UsageError
    from snapver.ops.log import parse_since
    from snapver.ops.log_paths import log_changes

    if patch and stat:
        raise UsageError("choose one of -p and --stat")
    config = STATE.config()
    start = parse_since(since) if since is not None else None
    store = STATE.store(config)
    paths = ctx.meta.get(PATHS_KEY, [])
    logged = log_changes(store, config, node, limit, start, paths, changes=patch or stat)
    snapshots = [entry.snapshot for entry in logged]
    if json_out:
        emit_json({"snapshots": [entry.to_json() for entry in logged], "exit_code": 0})
        return 0
    out = console()
    if not snapshots and paths:
        out.print(f"no snapshot{' of ' + escape(node) if node else ''} changed {escape(' '.join(paths))}")
    elif not snapshots:
        out.print("no snapshots yet" + (f" of {escape(node)}" if node else "")
                  + (f" since {escape(since)}" if since else "") + (" (run `snapver pull`)" if not since else ""))
    made_by = {s.id: show_path(s.made_by, markup=False) for s in snapshots}  # `push NAME`: NAME is the store's
    width = max(map(len, made_by.values()), default=0)
    # A team store's log says who took each snapshot (only when more than one store did).
    by_writer = len({s.writer for s in snapshots}) > 1
    for entry in logged:
        _print_snapshot(out, entry.snapshot, made_by, width, by_writer, oneline)
        if entry.changes is not None:
            _print_changes(entry.changes, stat)
    return 0


def _print_changes(changes: object, stat: bool) -> None:
    """-p: the diff text after a snapshot's line; --stat: its diffstat."""
    from snapver.cli.diff import print_stat, print_unified

    if stat:
        print_stat(changes)
    else:
        sys.stdout.flush()
        print_unified(changes)


def _print_snapshot(out: Any, s: Any, made_by: dict[str, str], width: int, by_writer: bool, oneline: bool) -> None:
    """One snapshot's line (or lines), as `log` prints it."""
    tags = f" [yellow]({show_list(s.tags)})[/yellow]" if s.tags else ""
    if by_writer:
        tags += f" by {show_path(s.writer or '?')}"
    made = made_by[s.id]
    event = f"[cyan]{escape(made if oneline else f'{made:<{width}}')}[/cyan]"
    note = [show_path(s.message)] if s.message else []
    if oneline:
        out.print(fields_line(out, [f"[bold]{s.id[:10]}[/bold]", f"{s.time:%Y-%m-%d %H:%M}", show_path(s.node),
                                    f"{event}{tags}", *note], separator=" "))
        return
    out.print(fields_line(out, [f"[bold]{s.id[:10]}[/bold]", f"{s.time:%Y-%m-%d %H:%M}",
                                f"{show_path(s.node):<10} {event}", f"{s.files} files, {s.changed} changed",
                                f"{show_list(s.dists) or '-'}{tags}", *note]))
