"""`snapver status [NODE|GROUP...] [--files] [--against REF] [-- PATH...]`: parse, call
ops.status, render the fleet table (or the fleet matrix)."""

from __future__ import annotations

import re
import stat
from typing import Any

import typer

from snapver.cli.app import PATHS_KEY, PathsAfterDashes, app
from snapver.cli.options import JsonOpt, NodesArg
from snapver.cli.render import console, emit_json, escape, outcome, print_error, print_table, show_list, show_path
from snapver.cli.state import STATE

WIDTH = 80  # the matrix fits it for up to MATRIX_BLOCK nodes
MATRIX_BLOCK = 8


class NodesThenPathsCommand(PathsAfterDashes):
    usage = "[NODE|GROUP]... [-- PATH...]"


@app.command(cls=NodesThenPathsCommand)
def status(
    ctx: typer.Context,
    targets: NodesArg = None,
    files: bool = typer.Option(False, "--files",
                               help="The fleet matrix: one row per file not the same on every node "
                               "(or per file named after `--`), a letter per node's content."),
    against: str | None = typer.Option(None, "--against", metavar="REF",
                                          help="Known-good code: a snapshot, tag or folder instead of "
                                          "each node's RECORD."),
    json_out: JsonOpt = False,
    checksum: bool = typer.Option(False, "-c", "--checksum",
                                  help="Hash every live file, even those whose stat is unchanged since the last pull."),
) -> int:
    """The fleet at a glance: reachable?, newest snapshot, changes, patched or hot-fixed.

    Each node against known-good code (its RECORD, or --against); exit 0 only when all is
    known and pulled.

    Examples:
      snapver status
      snapver status tp8 --against may22
      snapver status --files -- sglang/srt/server_args.py
    """
    from snapver.errors import UsageError
    from snapver.ops.status import fleet_matrix
    from snapver.ops.status import status as run_status

    paths = ctx.meta.get(PATHS_KEY, [])
    if paths and not files:
        raise UsageError("paths after `--` choose the rows of the fleet matrix",
                         hint="add --files: snapver status --files -- sglang/srt/x.py")
    config = STATE.config()
    specs = config.select(targets or [], all_nodes=not targets)
    store = STATE.store(config) if (config.store_path / "HEAD").exists() else None
    result = run_status(store, specs, checksum, config=config, against=against)
    if files:
        matrix = fleet_matrix(result, paths)
        outcome(matrix.exit_code)
        if json_out:
            emit_json(matrix.to_json())
        else:
            render_matrix(matrix)
        return matrix.exit_code
    outcome(result.exit_code)
    if json_out:
        emit_json({"nodes": [n.to_json() for n in result.nodes], "against": against, "exit_code": result.exit_code})
        return result.exit_code
    render_status(result)
    return result.exit_code


def render_status(result: Any) -> None:
    out = console()
    columns: tuple[str, ...] = ("node", "reachable", "snapshot", "since snapshot", "known-good", "state", "restart")
    rows: list[tuple[str, ...]]
    rows = [(escape(row.node), _reachable(row), _snapshot(row), _drift(row), _known_good(row), _state(row),
             _restart(row)) for row in result.nodes]
    # The restart column stays, zeros too: 0 says the processes were looked at.
    if out.is_terminal:  # laid out for its width (cli/fit.py); scripts get the whole table
        from snapver.cli.fit import print_fitted

        print_fitted(out, columns, rows, lambda: (SHORT_COLUMNS, [_short_row(row) for row in result.nodes]))
    else:
        print_table(out, columns, rows)
    for row in result.nodes:
        if row.error is not None:
            print_error(row.error)
        if row.push:
            push = row.push
            what = f"{push['action']} {push.get('patch') or ''}".strip()
            when = str(push.get("time", ""))[:16].replace("T", " ")
            if push.get("interrupted"):
                by = f" by {show_path(push['writer'])}" if push.get("writer") else ""
                out.print(f"[red]{escape(row.node)}: INTERRUPTED {show_path(what)} ({escape(when)}{by})[/red]: "
                          f"run `snapver rollback {escape(row.node)}` to repair it")
            elif push.get("writer"):  # a team store: the ledger says who
                verb = "pushed" if push["action"] == "push" else "rolled back"
                out.print(f"{escape(row.node)}: " + (f"patch {show_path(push['patch'])} " if push.get("patch") else "")
                          + f"({verb} by {show_path(push['writer'])} {escape(when)}, {show_path(push['state'])})"
                          + (f": {show_path(push['waves'])}" if push.get("waves") else ""))
            else:
                out.print(f"{escape(row.node)}: last {show_path(what)} {show_path(push['state'])} ({escape(when)})"
                          + (f": {show_path(push['waves'])}" if push.get("waves") else ""))
        if getattr(row, "restart_error", None) and row.error is None:
            out.print(f"{escape(row.node)}: its processes could not be listed: {escape(row.restart_error)}")
        elif getattr(row, "restart_needed", None):
            out.print(f"{escape(row.node)}: {row.restart_needed} process(es) run code older than the tree: "
                      f"`snapver ps {escape(row.node)}` names them")
        if getattr(row, "last_seen", False):
            out.print(f"{escape(row.node)}: down: as last seen in snapshot {row.snapshot[:10]} "
                      f"({age(row.age_seconds)} ago), not live")
        if row.unchecked and row.error is None:
            _say(out, f"{escape(row.node)}: {escape(row.unchecked)}")
        for note in [*getattr(row, "not_compared", []), *getattr(row, "notes", [])]:
            _say(out, f"{escape(row.node)}: {escape(note)}")
        if row.drift:
            count = len(row.drift)
            out.print(f"\n{escape(row.node)}: {count} file{'s' if count != 1 else ''} changed since snapshot "
                      f"{row.snapshot[:10] if row.snapshot else '?'}")
            for item in row.drift:  # no label where nothing is known-good
                _file_line(out, item.status, show_path(item.path), _label(item))
        if row.off and row.known_good is not None:
            out.print(f"\n{escape(row.node)}: {len(row.off)} file{'s' if len(row.off) != 1 else ''} "
                      f"not as {show_path(row.known_good.label)}"
                      + (" when last seen" if getattr(row, "last_seen", False) else ""))
            for item in row.off:
                _file_line(out, item.status, show_path(item.path), _label(item))


def _say(out: Any, markup: str) -> None:
    """A note: on a terminal, wrapped at word boundaries."""
    if out.is_terminal:
        from snapver.cli.fit import print_wrapped

        print_wrapped(out, markup)
    else:
        out.print(markup)


def _file_line(out: Any, status: str, path: str, label: str) -> None:
    """``  M  PATH  LABEL``; on a terminal too narrow, the label on the next line."""
    if out.is_terminal:
        from snapver.cli.fit import print_file

        print_file(out, status, path, label)
    else:
        out.print(f"  {status}  {path}" + (f"  {label}" if label else ""))


SHORT_COLUMNS = ("node", "up", "snapshot", "changed", "known-good", "state", "restart")


def _short_row(row: Any) -> tuple[str, ...]:
    """The row in short forms (7-digit ids, ages, no tags, no patch names: the lines below
    the table name them) for a terminal too narrow for the whole table."""
    snapshot = f"{row.snapshot[:7]} {age(row.age_seconds)}" if row.snapshot else "none"
    if getattr(row, "last_seen", False):
        snapshot = f"[dim]{snapshot}[/dim]"
    known = row.known_good
    known_good = ("RECORD" if known.kind == "record" else show_path(known.name)) if known is not None \
        else _known_good(row)
    from snapver.cli.fit import plain

    state = re.sub(r" \([^)]*\)", "", plain(_state(row)))
    return (escape(row.node), _reachable(row), snapshot, _drift(row).replace(" files", "").replace(" file", ""),
            known_good, escape(state), _restart(row))


def _restart(row: Any) -> str:
    """Processes running code older than the node's tree (`snapver ps` names them)."""
    count = getattr(row, "restart_needed", None)
    if count is None:
        return "?" if getattr(row, "restart_error", None) else "-"
    return f"[red]{count}[/red]" if count else "0"


def _label(item: Any) -> str:
    if getattr(item, "source", ""):  # differs from --against, but as its source makes it
        return f"[green]{item.label} ({escape(item.source)})[/green]"
    if item.label == "patch":
        return f"[yellow]patch {show_list(item.patches)}[/yellow]"
    if item.label == "hot-fix":
        return "[red]hot-fix[/red]"
    return f"[green]{item.label}[/green]" if item.label else ""


def _reachable(row: Any) -> str:
    if row.reachable:
        return "[green]yes[/green]"
    return "[red]no[/red]" if row.error is not None and row.error.exit_code == 3 else "[red]error[/red]"


def age(seconds: float) -> str:
    """``42s``, ``5m``, ``3h``, ``2d``: how long ago, as `ls`-like tools say it."""
    for size, unit in ((86400, "d"), (3600, "h"), (60, "m")):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"


def _snapshot(row: Any) -> str:
    if not row.snapshot:
        return "none (snapver pull)"
    tags = f" ({show_list(row.tags)})" if row.tags else ""
    cell = f"{row.snapshot[:10]} {age(row.age_seconds)} ago{tags}"
    return f"[dim]{cell}[/dim]" if getattr(row, "last_seen", False) else cell


def _drift(row: Any) -> str:
    if row.error is not None:
        return "?"
    if row.drift is None:
        return "-"
    if not row.drift:
        return "[green]none[/green]"
    return f"[red]{len(row.drift)} file{'s' if len(row.drift) != 1 else ''}[/red]"


def _known_good(row: Any) -> str:
    if row.known_good is None:
        if row.error is not None:
            return "?"
        return "none" if row.unchecked else "-"
    return show_path(row.known_good.label)


def _state(row: Any) -> str:
    if getattr(row, "last_seen", False) and row.off is not None:  # down: its newest snapshot's state
        return f"[dim]was {_live_state(row)}[/dim]"
    if row.error is not None:
        return "?"
    return _live_state(row)


def _live_state(row: Any) -> str:
    if row.off is None:
        return "[yellow]unknown[/yellow]"  # the note below says why
    if not row.off:
        return "[green]pristine[/green]"
    parts = []
    patched = row.patched
    if patched:
        count = sum(1 for item in row.off if item.label == "patch")
        parts.append(f"[yellow]{count} patched ({show_list(sorted(patched))})[/yellow]")
    if row.hot_fixed:
        parts.append(f"[red]{len(row.hot_fixed)} hot-fixed[/red]")
    as_source = sum(1 for item in row.off if getattr(item, "source", ""))
    if as_source:  # they differ from --against REF, but are pristine
        parts.append(f"[green]{as_source} pristine[/green]")
    return ", ".join(parts)


# -- the fleet matrix ------------------------------------------------------------------------

def render_matrix(matrix: Any) -> None:
    """Blocks of up to MATRIX_BLOCK node columns (2 characters each) under a stepped header
    of node names, the path after them, each row's legend below it: 80 columns hold it."""
    out = console()
    nodes = matrix.nodes
    for row in matrix.status.nodes:
        if row.error is not None:
            print_error(row.error)
    compared = _compared(matrix)
    if not matrix.rows:
        if len(matrix.compared) < 2 and matrix.not_compared:  # agreement of one node with itself says nothing
            read = f"only {escape(matrix.compared[0])} was read" if matrix.compared else "no node was read"
            out.print(f"nothing compared: {read}{compared}")
        else:
            out.print(f"all files agree on {_nodes_read(matrix)}{compared}")
        return
    lines: list[str] = []
    for start in range(0, len(nodes), MATRIX_BLOCK):
        block = range(start, min(start + MATRIX_BLOCK, len(nodes)))
        if start:
            lines.append("")
        for depth, index in enumerate(block):
            lines.append("".join("| " for _ in range(depth)) + nodes[index])
        lines.append("".join("| " for _ in block).rstrip())
        for row in matrix.rows:
            letters = "".join(f"{row.letters[index]} " for index in block)
            lines.append(f"{letters} {show_path(row.path, markup=False)}")
            used = {row.letters[index] for index in block}
            legend = [_legend_item(item) for item in row.legend if item.letter in used]
            lines.extend(_wrapped(legend, indent=2 * len(block) + 1))
    for line in lines:
        out.print(escape(line))
    differ = sum(1 for row in matrix.rows if row.agrees is False)
    every = "every node" if not matrix.not_compared else _nodes_read(matrix)
    out.print(f"{differ} file{'s differ' if differ != 1 else ' differs'} across {_nodes_read(matrix)}{compared}"
              if differ else f"the {len(matrix.rows)} file(s) named agree on {every}{compared}")


def _nodes_read(matrix: Any) -> str:
    """``3 nodes``, or ``the 2 nodes read`` when some were not."""
    count = len(matrix.compared)
    nodes = f"{count} node{'s' if count != 1 else ''}"
    return f"the {nodes} read" if matrix.not_compared else nodes


def _compared(matrix: Any) -> str:
    """``; not compared: ct129`` when a node could not be read (its error is above)."""
    return f"; not compared: {escape(', '.join(matrix.not_compared))}" if matrix.not_compared else ""



def _legend_item(item: Any) -> str:
    """``A pristine sglang 0.5.23``, ``B patch fix-b``, ``C hot-fix 1a2b3c4d5e``, ``D 1a2b3c4d5e``;
    ``… mode 100755`` or ``… link`` where the row's contents differ in mode or kind."""
    what, oid = item.what, item.oid
    if what.startswith(("pristine ", "as ", "patch ")):
        text = f"{item.letter} {what}"
    else:
        text = f"{item.letter} {what} {oid[:10]}" if what else f"{item.letter} {oid[:10]}"
    if not item.show_mode:
        return text
    return f"{text} {'link' if stat.S_ISLNK(item.mode) else f'mode {item.mode:o}'}"


def _wrapped(items: list[str], indent: int) -> list[str]:
    """``items`` two spaces apart on lines of at most WIDTH columns (an item never split)."""
    lines: list[str] = []
    current = ""
    for item in items:
        if current and indent + len(current) + 2 + len(item) > WIDTH:
            lines.append(" " * indent + current)
            current = item
        else:
            current = f"{current}  {item}" if current else item
    if current:
        lines.append(" " * indent + current)
    return lines
