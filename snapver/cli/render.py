"""Results → text, tables and JSON: the only module that prints (besides errors).

Off a terminal, rich prints markup as plain lines; `PlainConsole` prints those same bytes
without importing rich (~30 ms of start-up), and hands rich whatever it is unsure of.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import TYPE_CHECKING, Any, Optional, Union

from snapver.cli.app import STATE

if TYPE_CHECKING:
    from rich.console import Console

# Off a terminal, lines are never wrapped or cut: as good as unlimited.
PLAIN_WIDTH = 400


def console(stderr: bool = False) -> Union[Console, PlainConsole]:
    """A console for stdout or stderr; off a terminal, lines are never wrapped or cut."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return rich_console(stderr, None, not STATE.color)
    if _rich_may_colour():
        return rich_console(stderr, PLAIN_WIDTH, not STATE.color)
    return PlainConsole(stderr, not STATE.color)


def rich_console(stderr: bool, width: Optional[int], no_color: bool) -> Console:
    from rich.console import Console

    return Console(stderr=stderr, no_color=no_color, highlight=False, soft_wrap=True, width=width)


def _rich_may_colour() -> bool:
    """True where rich may colour (or reroute) output that does not go to a terminal."""
    import builtins

    return "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ or hasattr(builtins, "get_ipython")


# rich's own patterns (rich.markup.RE_TAGS, rich._emoji_replace, rich.markup.escape).
_TAGS = re.compile(r"""((\\*)\[([a-z#/@][^[]*?)])""")
_EMOJI = re.compile(r":\S*?:")
_ESCAPE = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")
# The only tags PlainConsole resolves itself: styles, which print nothing off a terminal.
_STYLES = frozenset({"bold", "red", "green", "yellow", "cyan", "white"})
# Characters rich strips, expands (tab) or may treat apart: such text goes to rich.
_UNSURE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")


class PlainConsole:
    """What `rich.console.Console` prints off a terminal (no colour, no wrapping), for str markup.

    Anything else (a table, an emoji code, a tab, a long line, unknown markup) goes to a real
    rich console made then, so the bytes are rich's in every case.
    """

    is_terminal = False
    width = PLAIN_WIDTH

    def __init__(self, stderr: bool = False, no_color: bool = False) -> None:
        self.stderr = stderr
        self.no_color = no_color
        self._rich: Optional[Console] = None

    def print(self, *objects: Any, **options: Any) -> None:
        plain = len(objects) == 1 and options.keys() <= {"style"} and options.get("style") is None
        text = plain_text(objects[0]) if plain else None
        if text is None:
            if self._rich is None:
                self._rich = rich_console(self.stderr, PLAIN_WIDTH, self.no_color)
            self._rich.print(*objects, **options)
            return
        self.write(text + "\n")

    def write(self, text: str) -> None:
        """Write ``text`` (plain, no markup) as rich would."""
        stream = sys.stderr if self.stderr else sys.stdout
        stream = getattr(stream, "rich_proxied_file", stream)  # as rich: past a live progress bar
        try:
            try:
                stream.write(text)
            except UnicodeEncodeError as error:  # as rich says it
                error.reason = f"{error.reason}\n*** You may need to add PYTHONIOENCODING=utf-8 to your environment ***"
                raise
            stream.flush()
        except BrokenPipeError:  # as rich: stdout to /dev/null, exit 1 (Console.on_broken_pipe)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            raise SystemExit(1) from None


def plain_text(markup: object) -> Optional[str]:
    """``markup`` as rich prints it off a terminal (without the newline), or None when unsure."""
    if not isinstance(markup, str):
        return None
    if "[" in markup:
        pieces: list[str] = []
        opened: list[str] = []
        position = 0
        for match in _TAGS.finditer(markup):
            full_text, escapes, tag = match.groups()
            start, end = match.span()
            if start > position:
                pieces.append(markup[position:start])
            position = end
            backslashes, escaped = divmod(len(escapes), 2)
            pieces.append("\\" * backslashes)
            if escaped:
                pieces.append(full_text[len(escapes):])
            elif tag in _STYLES:
                opened.append(tag)
            elif tag == "/" and opened:
                opened.pop()
            elif tag[0] == "/" and tag[1:] in opened:
                del opened[len(opened) - 1 - opened[::-1].index(tag[1:])]
            else:
                return None  # a tag of another kind, or one rich refuses (MarkupError)
        pieces.append(markup[position:])
        markup = "".join(piece.replace("\\[", "[") for piece in pieces)
    if _EMOJI.search(markup) or _UNSURE.search(markup) or any(len(line) > PLAIN_WIDTH
                                                              for line in markup.split("\n")):
        return None
    return markup


def print_table(out: Union[Console, PlainConsole], columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A table of markup cells as `rich.table.Table(box=None, pad_edge=False)` prints it."""
    text = plain_table(columns, rows) if isinstance(out, PlainConsole) else None
    if text is not None:
        out.write(text)
        return
    from rich.table import Table

    table = Table(box=None, pad_edge=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    out.print(table)


def plain_table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> Optional[str]:
    """The lines rich prints for such a table off a terminal, or None when unsure.

    Every column is as wide as its widest cell; two spaces between columns, none at the
    edges; every cell (the last too) padded to its column's width.
    """
    cells = [[plain_text(cell) for cell in row] for row in [tuple(columns), *rows]]
    if not columns or any(len(row) != len(columns) for row in cells):
        return None
    for row in cells:  # one short line of one-cell-wide characters a cell, or rich decides
        for cell in row:
            if cell is None or not cell.isascii() or "\n" in cell:
                return None
    widths = [max(len(row[index]) for row in cells) for index in range(len(columns))]
    if sum(widths) + 2 * (len(widths) - 1) > PLAIN_WIDTH or not all(widths):
        return None  # rich would wrap cells (or give an empty column a width)
    return "".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "\n" for row in cells)


def emit_json(document: Any) -> None:
    """One JSON document on stdout."""
    sys.stdout.write(json.dumps(document, indent=2, ensure_ascii=False, default=str) + "\n")


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


def escape(text: str) -> str:
    """Make text safe for rich markup (and keep odd bytes printable): `rich.markup.escape`."""
    markup = _ESCAPE.sub(lambda match: f"{match[1]}{match[1]}\\{match[2]}",
                         text.encode("utf-8", "backslashreplace").decode("utf-8"))
    if markup.endswith("\\") and not markup.endswith("\\\\"):
        return markup + "\\"
    return markup


def show_path(path: str, markup: bool = True) -> str:
    """A file name (or other one-line text from the store, a message) as every command prints
    it: C-quoted in double quotes, as git quotes it, when it holds a control character
    (newline, ESC…), a quote, a backslash or bytes that are not UTF-8 — so a name can
    neither break a line nor drive the terminal; as it is otherwise. Markup-escaped for a
    console, unless ``markup`` is False (bytes written raw).
    """
    from snapver.model import quote_path

    quoted = quote_path(path)
    return escape(quoted) if markup else quoted


def print_error(error: Any) -> None:
    """A SnapverError met by one node of many, as `main` prints a fatal one: the line, then its hint."""
    err = console(stderr=True)
    err.print(f"snapver: error: {escape(error.message)}")
    if error.hint:
        err.print(f"hint: {escape(error.hint)}")
