"""`snapver log`: parse, call one operation, render."""

from __future__ import annotations

import typer

from snapver.cli.app import app
from snapver.cli.options import JsonOpt
from snapver.cli.render import console, emit_json, escape, fields_line, show_list, show_path
from snapver.cli.state import STATE


@app.command()
def log(
    node: str | None = typer.Argument(None, help="Only this node's snapshots (or a group's, or a range's)."),
    limit: int | None = typer.Option(None, "-n", help="At most N snapshots.", min=1),
    since: str | None = typer.Option(None, "--since", metavar="DATE",
                                        help="Only snapshots taken on or after DATE (2026-05-22, may22, ISO time)."),
    oneline: bool = typer.Option(False, "--oneline", help="One short line per snapshot: id, date, node, event."),
    json_out: JsonOpt = False,
) -> int:
    """Snapshots, newest first: id, date, node, what made it, files changed, tags, version.

    What made it: pull, push NAME, rollback or import; the message follows.

    Examples:
      snapver log
      snapver log ct200 -n 5
      snapver log --since may22 --oneline
    """
    from snapver.ops.log import log as read_log
    from snapver.ops.log import parse_since

    config = STATE.config()
    start = parse_since(since) if since is not None else None
    store = STATE.store(config)
    snapshots = read_log(store, config, node, limit, start)
    if json_out:
        emit_json({"snapshots": [s.to_json() for s in snapshots], "exit_code": 0})
        return 0
    out = console()
    if not snapshots:
        out.print("no snapshots yet" + (f" of {escape(node)}" if node else "")
                  + (f" since {escape(since)}" if since else "") + (" (run `snapver pull`)" if not since else ""))
    made_by = {s.id: show_path(s.made_by, markup=False) for s in snapshots}  # `push NAME`: NAME is the store's
    width = max(map(len, made_by.values()), default=0)
    # A team store's log says who took each snapshot (only when more than one store did).
    by_writer = len({s.writer for s in snapshots}) > 1
    for s in snapshots:
        tags = f" [yellow]({show_list(s.tags)})[/yellow]" if s.tags else ""
        if by_writer:
            tags += f" by {show_path(s.writer or '?')}"
        made = made_by[s.id]
        event = f"[cyan]{escape(made if oneline else f'{made:<{width}}')}[/cyan]"
        note = [show_path(s.message)] if s.message else []
        if oneline:
            out.print(fields_line(out, [f"[bold]{s.id[:10]}[/bold]", f"{s.time:%Y-%m-%d %H:%M}", show_path(s.node),
                                        f"{event}{tags}", *note], separator=" "))
            continue
        out.print(fields_line(out, [f"[bold]{s.id[:10]}[/bold]", f"{s.time:%Y-%m-%d %H:%M}",
                                    f"{show_path(s.node):<10} {event}", f"{s.files} files, {s.changed} changed",
                                    f"{show_list(s.dists) or '-'}{tags}", *note]))
    return 0
