"""`snapver env [NODE|GROUP...] [--all] [--json] [-- NAME...]`: parse, call ops.env, render
the environment matrix (a row per item, a column per node, in blocks that fit the terminal, 80
columns off one; a record per item when not even one column fits; nothing cut)."""

from __future__ import annotations

from typing import Any

import typer

from snapver.cli.app import PATHS_KEY, PathsAfterDashes, app
from snapver.cli.options import JsonOpt, NodesArg
from snapver.cli.render import console, emit_json, escape, outcome, print_error
from snapver.cli.state import STATE
from snapver.model import quote_controls

WIDTH = 80  # off a terminal, the blocks' width
ITEM_WIDTH = 24  # when not every item fits: the widest item kept in the blocks,
VALUE_WIDTH = 14  # and the widest value (the others are records after them)
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


def shown(text: str) -> str:
    """``text`` with control characters written as escapes (one line, never cut)."""
    return quote_controls(text)


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
    width = None if STATE.wide else out.width if out.is_terminal else WIDTH
    for line in matrix_lines(result.rows, compared, width):
        out.print(escape(line))
    missing = f"; not compared: {', '.join(result.not_compared)}" if result.not_compared else ""
    if result.differ:
        marked = any(row.outliers for row in result.rows)
        out.print(escape(f"{result.differ} of {result.items} items differ across {len(compared)} nodes{missing}"
                         + (f" ({OUTLIER}: not what most nodes have)" if marked else "")))
    else:
        what = "item named agrees" if named and result.items == 1 else "items agree"
        out.print(escape(f"the {result.items} {what} on {len(compared)} nodes{missing}"))


def matrix_lines(rows: list[Any], nodes: list[str], width: int | None = WIDTH) -> list[str]:
    """The matrix as lines of at most ``width`` characters (None: no limit), nothing cut:
    blocks of as many node columns as fit; when setting apart the items too long for a short
    column (a long name or value) lets more columns fit, those as records after the blocks."""
    if width is None:
        return _block(rows, nodes, *_widths(rows, nodes))
    every = _per_block(rows, nodes, width)
    fit = [row for row in rows if _short(*_widths([row], nodes))]
    short = _per_block(fit, nodes, width) if fit else 0
    if every < len(nodes) and short > every and len(fit) < len(rows):
        return _blocks(fit, nodes, short) + [""] + _records([row for row in rows if row not in fit], nodes)
    return _blocks(rows, nodes, every) if every else _records(rows, nodes)


def _per_block(rows: list[Any], nodes: list[str], width: int) -> int:
    """How many node columns fit in ``width`` beside the items (two spaces, the value, its outlier mark each)."""
    item_width, value_width = _widths(rows, nodes)
    return max(0, (width - item_width) // (value_width + 3))


def _short(item_width: int, value_width: int) -> bool:
    return item_width <= ITEM_WIDTH and value_width <= VALUE_WIDTH


def _widths(rows: list[Any], nodes: list[str]) -> tuple[int, int]:
    """The item column's width and one node column's (its outlier mark aside): their widest
    texts (one width for every node's column: blocks line up, one under the other)."""
    item = max(len(shown(row.item)) for row in rows)
    value = max([len(shown(node)) for node in nodes]
                + [len(shown(value or ABSENT)) for row in rows for value in row.values.values()])
    return item, value


def _blocks(rows: list[Any], nodes: list[str], per_block: int) -> list[str]:
    """Blocks of ``per_block`` node columns, one under the other."""
    lines: list[str] = []
    for first in range(0, len(nodes), per_block):
        lines += ([""] if first else []) + _block(rows, nodes[first:first + per_block], *_widths(rows, nodes))
    return lines


def _block(rows: list[Any], nodes: list[str], item_width: int, value_width: int) -> list[str]:
    header = "".ljust(item_width) + "".join("  " + shown(node).ljust(value_width) + " " for node in nodes)
    lines = [header.rstrip()]
    for row in rows:
        cells = []
        for node in nodes:
            value = shown(row.values.get(node) or ABSENT).ljust(value_width)
            cells.append("  " + value + (OUTLIER if node in row.outliers else " "))
        lines.append((shown(row.item).ljust(item_width) + "".join(cells)).rstrip())
    return lines


def _records(rows: list[Any], nodes: list[str]) -> list[str]:
    """Each item on a line, then a ``  NODE  VALUE`` line per node (as `kubectl describe`)."""
    node_width = max(len(shown(node)) for node in nodes)
    lines: list[str] = []
    for row in rows:
        lines += [shown(row.item)] + [
            ("  " + shown(node).ljust(node_width) + "  " + shown(row.values.get(node) or ABSENT)
             + (OUTLIER if node in row.outliers else "")) for node in nodes]
    return lines
