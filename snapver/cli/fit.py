"""Tables laid out for the terminal's width (80 columns first): the longest form that fits.

A table is printed whole when it fits (or off a terminal, or with `-w/--wide`); else in its
short form, when the command gives one and it fits; else vertically, a record per row
(as `kubectl describe`): the row's first cell, then a ``column  value`` line for each
other cell, a value too long for its line on a line of its own. Nothing is cut.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from snapver.cli.render import escape, print_table
from snapver.cli.state import STATE

if TYPE_CHECKING:
    from rich.console import Console

    from snapver.cli.render import PlainConsole

Rows = list[tuple[str, ...]]


def plain(markup: str) -> str:
    """A markup cell as it shows (styles dropped)."""
    from rich.text import Text

    return Text.from_markup(markup).plain


def table_width(columns: tuple[str, ...], rows: Rows) -> int:
    """How wide the table prints: each column as its widest cell, two spaces apart."""
    widths = [max(len(plain(cell)) for cell in column) for column in zip(columns, *rows, strict=False)]
    return sum(widths) + 2 * (len(widths) - 1)


def print_fitted(out: Console | PlainConsole, columns: tuple[str, ...], rows: Rows,
                 short: Callable[[], tuple[tuple[str, ...], Rows]] | None = None) -> None:
    """``rows`` under ``columns`` in the longest form that fits ``out`` (see the module);
    ``short`` makes the short form (its columns and rows), only when it is needed."""
    if not out.is_terminal or STATE.wide or table_width(columns, rows) <= out.width:
        print_table(out, columns, rows)
        return
    short_form = short() if short is not None else None
    if short_form is not None and table_width(*short_form) <= out.width:
        print_table(out, *short_form)
    else:
        print_records(out, columns, rows)


def print_records(out: Console | PlainConsole, columns: tuple[str, ...], rows: Rows, indent: int = 2) -> None:
    """Each row as a record: its first cell on a line, then ``column  value`` lines."""
    label_width = max(len(column) for column in columns[1:])
    for number, row in enumerate(rows):
        if number:
            out.print("")
        out.print(row[0])
        for column, cell in zip(columns[1:], row[1:], strict=False):
            head = " " * indent + escape(column).ljust(label_width) + "  "
            if len(plain(head)) + len(plain(cell)) <= out.width:
                out.print(head + cell)
            else:  # its own line, never cut (a path is one word)
                out.print(head.rstrip())
                out.print(" " * (2 * indent) + cell)


def print_wrapped(out: Console | PlainConsole, markup: str) -> None:
    """A line of prose (a note): on a terminal, wrapped at word boundaries by rich."""
    if out.is_terminal:
        out.print(markup, soft_wrap=False)
    else:
        out.print(markup)


def print_file(out: Console | PlainConsole, status: str, path: str, label: str = "") -> None:
    """``  M  PATH  LABEL`` (markup path and label); on a terminal too narrow for it, the
    label on the next line (as `git status -s` keeps a path whole)."""
    line = f"  {status}  {path}"
    if not label:
        out.print(line)
    elif not out.is_terminal or STATE.wide or len(plain(line)) + 2 + len(plain(label)) <= out.width:
        out.print(f"{line}  {label}")
    else:
        out.print(line)
        out.print(f"       {label}")


def print_beside(out: Console | PlainConsole, head: str, tail: str, separator: str = "  ", indent: int = 11) -> None:
    """``head`` and ``tail`` (markup) on one line; on a terminal too narrow for both (and
    without `-w/--wide`), ``tail`` on the next line, indented: neither is cut or broken."""
    if not out.is_terminal or STATE.wide or len(plain(head)) + len(separator) + len(plain(tail)) <= out.width:
        out.print(head + separator + tail)
    else:
        out.print(head)
        out.print(" " * indent + tail)
