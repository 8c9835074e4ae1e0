"""`snapver import DIR --node NAME [--date D] [--tag T] [-m MSG]`: parse, call ops.importdir, render."""

from __future__ import annotations

import typer

from snapver.cli.app import app
from snapver.cli.options import JsonOpt, NoteOpt
from snapver.cli.render import console, emit_json, escape
from snapver.cli.state import STATE


@app.command("import")
def import_(
    folder: str = typer.Argument(..., metavar="DIR", help="A folder: a site-packages, a source checkout, "
                                 "srt/, or the inside of sglang/srt (matched as a folder ref is)."),
    node: str = typer.Option(..., "--node", help="The node it is a snapshot of (a configured node, or a new "
                             "name for an archive)."),
    date: str | None = typer.Option(None, "--date", help="When the copy was taken: YYYY-MM-DD[THH:MM], local "
                                       "time (default: the newest mtime of its files)."),
    tag: str | None = typer.Option(None, "--tag", help="Tag the snapshot."),
    message: NoteOpt = "",
    root: str | None = typer.Option(None, "--root", metavar="PREFIX",
                                       help="The folder is site-packages/PREFIX (e.g. sglang/srt), not matched."),
    json_out: JsonOpt = False,
) -> int:
    """Record a local folder as a snapshot of NODE, dated --date; found by NODE@may22.

    Examples:
      snapver import ./backup/site-packages --node ct200 --date 2026-05-22
      snapver import ./srt --node ct200 --tag before-upgrade
    """
    from snapver.ops.importdir import import_folder

    config = STATE.config()
    store = STATE.store(config, create=True)
    result = import_folder(store, config, folder, node, date, tag, message, root)
    if json_out:
        emit_json(result.to_json())
        return 0
    err = console(stderr=True)
    err.print(escape(result.folder.describe()))
    out = console()
    when = f"{result.time:%Y-%m-%d %H:%M}"
    dated = "--date" if result.dated_by == "--date" else f"{result.dated_by}; choose with --date"
    parent = f" from {result.parent[:10]}" if result.parent else ""
    out.print(f"{escape(result.node)}: imported snapshot [bold]{result.commit[:10]}[/bold] dated {when} "
              f"({escape(dated)}) — {result.files} files, {result.changed} changed{parent}")
    if not result.is_newest and result.head:
        out.print(f"{escape(result.node)}@latest stays {result.head[:10]} (newer); the import is kept "
                  f"in date order as {escape(result.ref)}")
    if result.tag:
        out.print(f"tagged {escape(result.tag)}")
    return 0
