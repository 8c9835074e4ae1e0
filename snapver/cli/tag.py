"""`snapver tag NAME [REF]` / `tag --list` / `tag -d NAME`: parse, call ops.tag, render."""

from __future__ import annotations

import typer

from snapver.cli.app import app
from snapver.cli.options import JsonOpt
from snapver.cli.render import console, emit_json, escape, fields_line, show_path
from snapver.cli.state import STATE


@app.command()
def tag(
    name: str | None = typer.Argument(None, help="The tag to create (or, with -d, delete)."),
    ref: str | None = typer.Argument(None, help="The snapshot to name (default: the newest; "
                                        "a node name = its newest snapshot)."),
    list_tags: bool = typer.Option(False, "-l", "--list", help="List tags: snapshot, node, date."),
    delete: bool = typer.Option(False, "-d", "--delete", help="Delete tag NAME."),
    force: bool = typer.Option(False, "-f", "--force", help="Move an existing tag."),
    json_out: JsonOpt = False,
) -> int:
    """Name a snapshot; list or delete names.

    Examples:
      snapver tag may22 ct200     # ct200's newest snapshot is now may22
      snapver tag --list
      snapver tag -d may22
    """
    from snapver.errors import UsageError
    from snapver.ops import tag as ops

    config = STATE.config()
    out = console()
    if list_tags or (name is None and not delete):
        if name is not None or delete:
            raise UsageError("--list takes no tag name and no -d")
        tags = ops.list_tags(STATE.store(config)) if (config.store_path / "HEAD").exists() else []
        if json_out:
            emit_json({"tags": [t.to_json() for t in tags], "exit_code": 0})
        elif not tags:
            out.print("no tags yet (snapver tag NAME [REF])")
        for info in tags if not json_out else []:
            # Broken between fields only, on a terminal too narrow for the line (a name stays whole).
            out.print(fields_line(out, [f"{escape(info.name):<20} {info.commit[:10]}", f"{info.time:%Y-%m-%d %H:%M}",
                                        show_path(info.node),
                                        *([f"({escape(info.kind)})"] if info.kind != "snapshot" else []),
                                        *([f"[red]{escape(info.note)}[/red]"] if info.note else [])]))
        return 0
    if name is None:
        raise UsageError("-d needs the tag to delete: snapver tag -d NAME")
    store = STATE.store(config)
    if delete:
        if ref is not None:
            raise UsageError("tag -d takes one name")
        info = ops.delete_tag(store, name)
        result = {"deleted": info.to_json()}
        message = f"deleted tag {escape(name)} (was {info.commit[:10]})"
    else:
        info = ops.create_tag(store, config, name, ref, force)
        result = {"tag": info.to_json()}
        verb = "moved" if info.replaced else ("kept" if info.note == "already there" else "tagged")
        message = (f"{verb} {escape(name)} → {info.commit[:10]} ({show_path(info.node)}, "
                   f"{info.time:%Y-%m-%d %H:%M})")
        if info.note and info.note != "already there":
            console(stderr=True).print(f"note: {escape(info.note)}")
    if json_out:
        emit_json({**result, "exit_code": 0})
    else:
        out.print(message)
    return 0
