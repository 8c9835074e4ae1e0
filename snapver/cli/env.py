"""`snapver env [NODE|GROUP...] [--all] [--json] [-- NAME...]`: parse, call ops.env, render
the environment matrix (a row per item, a column per node, in blocks that fit 80 columns)."""

from __future__ import annotations

from typing import Any

import typer

from snapver.cli.app import PATHS_KEY, PathsAfterDashes, app
from snapver.cli.options import JsonOpt, NodesArg
from snapver.cli.render import console, emit_json, escape, outcome, print_error
from snapver.model import quote_controls

WIDTH = 80
ITEM_WIDTH = 24  # the item column at most (longer names are shortened)
VALUE_WIDTH = 14  # a node's column at most, its outlier mark aside
OUTLIER = "*"
ABSENT = "-"


class NodesThenNamesCommand(PathsAfterDashes):
    usage = "[NODE|GROUP]... [-- NAME...]"


@app.command(cls=NodesThenNamesCommand)
def env(
    ctx: typer.Context,
    targets: NodesArg = None,
    all_rows: bool = typer.Option(False, "--all", help="Every item, not only those that differ."),
    json_out: JsonOpt = False,
) -> int:
    """The environment under the tree, live: Python, distributions, torch's CUDA, GPU, driver.

    A row per item not the same on every node (every item with --all; the items named
    after `--`, globs allowed), a column per node; `*` marks an outlier (a value most
    nodes do not have). Exit 0 when all agree, 1 when they differ, 3 when a node could
    not be read (the others are shown).

    Examples:
      snapver env
      snapver env tp8 --all
      snapver env -- torch 'flashinfer*'
    """
    from snapver.cli.state import STATE
    from snapver.ops.env import env as run_env

    names = ctx.meta.get(PATHS_KEY, [])
    config = STATE.config()
    result = run_env(config.select(targets or [], all_nodes=not targets), all_rows=all_rows, names=names)
    outcome(result.exit_code)
    if json_out:
        emit_json(result.to_json())
    else:
        render_env(result, bool(names))
    return result.exit_code


def shorten(text: str, width: int) -> str:
    """``text`` quoted (control characters written as escapes), at most ``width`` characters."""
    text = quote_controls(text)
    return text if len(text) <= width else text[: width - 1] + "\u2026"


def render_env(result: Any, named: bool) -> None:
    out = console()
    for node in result.nodes:
        if node.error is not None:
            print_error(node.error)
    for node in result.nodes:
        for note in node.environment.notes if node.environment else ():
            out.print(f"{escape(node.node)}: {escape(quote_controls(note))}")
    compared = result.compared
    if not result.rows:
        if len(compared) < 2:
            read = f"only {escape(compared[0])} was read" if compared else "no node was read"
            out.print(f"nothing compared: {read}")
        else:
            out.print(f"all {result.items} items agree on {len(compared)} nodes")
        return
    for line in matrix_lines(result.rows, compared):
        out.print(escape(line))
    missing = f"; not compared: {', '.join(result.not_compared)}" if result.not_compared else ""
    if result.differ:
        marked = any(row.outliers for row in result.rows)
        out.print(escape(f"{result.differ} of {result.items} items differ across {len(compared)} nodes{missing}"
                         + (f" ({OUTLIER}: not what most nodes have)" if marked else "")))
    else:
        what = "item named agrees" if named and result.items == 1 else "items agree"
        out.print(escape(f"the {result.items} {what} on {len(compared)} nodes{missing}"))


def matrix_lines(rows: list[Any], nodes: list[str]) -> list[str]:
    """The matrix as lines of at most WIDTH characters: blocks of as many node columns as fit."""
    item_width = min(ITEM_WIDTH, max(len(quote_controls(row.item)) for row in rows))
    # One width for every node's column: blocks line up, one under the other.
    width = min(VALUE_WIDTH, max([len(node) for node in nodes] + [len(quote_controls(value or ABSENT))
                                                                  for row in rows for value in row.values.values()]))
    widths = dict.fromkeys(nodes, width)
    lines: list[str] = []
    block: list[str] = []
    used = item_width
    for node in nodes:
        if block and used + 2 + widths[node] + 1 > WIDTH:
            lines += _block(rows, block, widths, item_width) + [""]
            block, used = [], item_width
        block.append(node)
        used += 2 + widths[node] + 1
    return lines + _block(rows, block, widths, item_width)


def _block(rows: list[Any], nodes: list[str], widths: dict[str, int], item_width: int) -> list[str]:
    header = "".ljust(item_width) + "".join("  " + shorten(node, widths[node]).ljust(widths[node]) + " "
                                            for node in nodes)
    lines = [header.rstrip()]
    for row in rows:
        cells = []
        for node in nodes:
            value = shorten(row.values.get(node) or ABSENT, widths[node]).ljust(widths[node])
            cells.append("  " + value + (OUTLIER if node in row.outliers else " "))
        lines.append((shorten(row.item, item_width).ljust(item_width) + "".join(cells)).rstrip())
    return lines
