"""Results → text, tables and JSON: the only module that prints (besides errors).

Off a terminal, rich prints markup as plain lines; `PlainConsole` prints those same bytes
without importing rich (start-up time), and hands rich whatever it is unsure of.
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NoReturn

from snapver.cli.state import STATE

if TYPE_CHECKING:
    from rich.console import Console

# Off a terminal, lines are never wrapped or cut: as good as unlimited.
PLAIN_WIDTH = 400


def console(stderr: bool = False) -> Console | PlainConsole:
    """A console for stdout or stderr; off a terminal, lines are never wrapped or cut."""
    stream = sys.stderr if stderr else sys.stdout
    if not stderr and isinstance(stream, HeldOutput):  # a terminal's output, held for the pager
        return rich_console(False, stream.columns, not STATE.color, force_terminal=True)
    if stream.isatty():
        return rich_console(stderr, None, not STATE.color)
    if _rich_may_colour():
        return rich_console(stderr, PLAIN_WIDTH, not STATE.color)
    return PlainConsole(stderr, not STATE.color)


def rich_console(stderr: bool, width: int | None, no_color: bool,
                 force_terminal: bool | None = None) -> Console:
    return _console_class()(stderr=stderr, no_color=no_color, highlight=False, soft_wrap=True, width=width,
                            force_terminal=force_terminal)


@functools.cache
def _console_class() -> type[Console]:
    from rich.console import Console

    class QuietPipeConsole(Console):
        """rich's Console, ending as ``PlainConsole.write`` does when stdout's reader has gone
        (`reader_gone`; rich's own handler exits 1 whatever was found)."""

        def on_broken_pipe(self) -> None:
            if self.stderr:
                super().on_broken_pipe()
            self.quiet = True
            reader_gone()

    return QuietPipeConsole


def _rich_may_colour() -> bool:
    """True where rich may colour (or reroute) output that does not go to a terminal."""
    import builtins

    return "FORCE_COLOR" in os.environ or "TTY_COMPATIBLE" in os.environ or hasattr(builtins, "get_ipython")


# rich's own patterns (rich.markup.RE_TAGS, rich._emoji_replace, rich.markup.escape).
_TAGS = re.compile(r"""((\\*)\[([a-z#/@][^[]*?)])""")
_EMOJI = re.compile(r":\S*?:")
_ESCAPE = re.compile(r"(\\*)(\[[a-z#/@][^[]*?])")
# The only tags PlainConsole resolves itself: styles, which print nothing off a terminal.
_STYLES = frozenset({"bold", "dim", "red", "green", "yellow", "cyan", "white"})
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
        self._rich: Console | None = None

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
        except BrokenPipeError:  # `snapver log | head`: the reader has all it wanted
            reader_gone()


def outcome(code: int) -> int:
    """``code``, kept as the command's exit code should stdout's reader go away while its
    result is printed (`reader_gone`): a command calls it before printing a result whose
    code says something (1: differences found)."""
    STATE.outcome = code
    return code


def reader_gone() -> NoReturn:
    """stdout's reader has gone (`snapver diff | head`): stop printing, quietly, and exit
    with the code of the result being printed (`outcome`; 0 when the command set none)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    raise SystemExit(STATE.outcome)


def plain_text(markup: object) -> str | None:
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


# How a table's columns take the width of a console that is not a terminal (a terminal gets
# only tables that fit: ``cli/fit.py``): KEEP columns never wrap (what tells nodes, snapshots
# and dates apart), nor PATH columns; the others wrap at spaces.
KEEP_COLUMNS = frozenset({"node", "address", "reachable", "snapshot", "date", "id", "patch"})
PATH_COLUMNS = frozenset({"site-packages", "python"})
MIN_PATH = 10  # a path column keeps at least this many characters


def print_table(out: Console | PlainConsole, columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> None:
    """A table of markup cells as `rich.table.Table(box=None, pad_edge=False)` prints it.

    On a terminal it is given only a table that fits (``cli/fit.py print_fitted`` chooses the
    form); with `-w/--wide`, every cell is whole, lines as long as they need.
    """
    if isinstance(out, PlainConsole):
        text = plain_table(columns, rows)
        if text is not None:
            out.write(text)
            return
    from rich.table import Table
    from rich.text import Text

    plain = [[Text.from_markup(cell).plain for cell in column] for column in zip(columns, *rows, strict=False)]
    widths = [max(len(cell) for cell in column) for column in plain]
    needed = sum(widths) + 2 * (len(widths) - 1)
    if STATE.wide and out.is_terminal and needed > out.width:
        out = rich_console(False, needed, out.no_color, force_terminal=True)
    # The narrowest each column may be: KEEP whole, PATH down to MIN_PATH, the others to
    # their longest word (they wrap at spaces, never inside a word).
    least = [width if column in KEEP_COLUMNS else min(width, MIN_PATH) if column in PATH_COLUMNS
             else max(len(word) for cell in cells for word in (cell.split() or [""]))
             for column, width, cells in zip(columns, widths, plain, strict=False)]
    table = Table(box=None, pad_edge=False)
    for column, narrowest in zip(columns, least, strict=False):
        table.add_column(column, no_wrap=column in KEEP_COLUMNS or column in PATH_COLUMNS, min_width=narrowest)
    for row in rows:
        table.add_row(*row)
    out.print(table)


def fields_line(out: Console | PlainConsole, fields: list[str], separator: str = "  ",
                indent: int = 4) -> str:
    """Markup ``fields`` joined by ``separator`` on one line; on a terminal too narrow for it
    (and without `-w/--wide`), broken between fields, never inside one (a date stays whole),
    the next lines indented."""
    if not out.is_terminal or STATE.wide:
        return separator.join(fields)
    from rich.text import Text

    lines: list[str] = []
    current, used = "", 0
    for field in fields:
        length = Text.from_markup(field).cell_len
        if current and used + len(separator) + length > out.width:
            lines.append(current)
            current, used = " " * indent + field, indent + length
        else:
            current = f"{current}{separator}{field}" if current else field
            used += (len(separator) if used else 0) + length
    lines.append(current)
    return "\n".join(lines)


def plain_table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> str | None:
    """The lines rich prints for such a table off a terminal, or None when unsure.

    Every column is as wide as its widest cell; two spaces between columns, none at the
    edges; every cell (the last too) padded to its column's width.
    """
    texts = [[plain_text(cell) for cell in row] for row in [tuple(columns), *rows]]
    if not columns or any(len(row) != len(columns) for row in texts):
        return None
    cells: list[list[str]] = []
    for row in texts:  # one short line of one-cell-wide characters a cell, or rich decides
        plain = [cell for cell in row if cell is not None and cell.isascii() and "\n" not in cell]
        if len(plain) != len(row):
            return None
        cells.append(plain)
    widths = [max(len(row[index]) for row in cells) for index in range(len(columns))]
    if sum(widths) + 2 * (len(widths) - 1) > PLAIN_WIDTH or not all(widths):
        return None  # rich would wrap cells (or give an empty column a width)
    return "".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False)) + "\n" for row in cells
    )


# A byte of a name that is not UTF-8, as paths hold it (surrogateescape).
_UNDECODED = re.compile("[\udc80-\udcff]")


def emit_json(document: Any) -> None:
    """One JSON document on stdout (never through a pager), in UTF-8: a byte of a name that is
    not UTF-8 is written as the escape of its surrogate (``\\udcff``), which Python's ``json``
    reads back as it was (``os.fsencode`` gives the name's bytes), not as the raw byte."""
    if isinstance(sys.stdout, HeldOutput):
        sys.stdout.unpaged = True
    text = json.dumps(document, indent=2, ensure_ascii=False, default=str)
    sys.stdout.write(_UNDECODED.sub(lambda found: f"\\u{ord(found.group()):04x}", text) + "\n")


def human_bytes(count: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(count) < 1000 or unit == "GB":
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"


def escape(text: str) -> str:
    """Make text safe for rich markup (`rich.markup.escape`) and for the terminal: odd bytes
    printable, control characters (but newline and tab) C-escaped as `show_path` writes them."""
    from snapver.model import quote_controls

    markup = _ESCAPE.sub(lambda match: f"{match[1]}{match[1]}\\{match[2]}",
                         quote_controls(text).encode("utf-8", "backslashreplace").decode("utf-8"))
    if markup.endswith("\\") and not markup.endswith("\\\\"):
        return markup + "\\"
    return markup


def show_path(path: str, markup: bool = True) -> str:
    """A file name, or any other one-line text a node or the store gave (a version, a writer
    id, a message, a hostname, a python path), as every command prints it: C-quoted in double
    quotes, as git quotes it, when it holds a control character (newline, ESC…), a quote, a
    backslash or bytes that are not UTF-8 — so it can neither break a line nor drive the
    terminal; as it is otherwise. Markup-escaped for a console (``[red]`` stays text), unless
    ``markup`` is False (bytes written raw).
    """
    from snapver.model import quote_path

    quoted = quote_path(path)
    return escape(quoted) if markup else quoted


def show_list(texts: Iterable[str], separator: str = ", ") -> str:
    """Several such texts (versions, tags, node names), each as `show_path` shows it."""
    return separator.join(show_path(text) for text in texts)


def print_error(error: Any) -> None:
    """A SnapverError met by one node of many, as `main` prints a fatal one: the line, then its hint."""
    err = console(stderr=True)
    err.print(f"snapver: error: {escape(error.message)}")
    hint = error.shown_hint
    if hint:
        err.print(f"hint: {escape(hint)}")


# -- the pager -------------------------------------------------------------------------------
#
# As git: on a terminal, output longer than the screen goes through $SNAPVER_PAGER, else
# the config's [ui] pager command, else $PAGER, else `less -FRX`. The output is held in
# memory while the command runs (these commands print once their work is done), so that
# a screenful or less is printed as it is and never starts a pager.

DEFAULT_PAGER = "less -FRX"
_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


class HeldOutput(io.TextIOWrapper):
    """stdout while a command runs on a terminal: kept in memory, a terminal to whoever asks."""

    def __init__(self, terminal: Any, columns: int, rows: int) -> None:
        super().__init__(io.BytesIO(), encoding=terminal.encoding, errors=terminal.errors, write_through=True)
        self.terminal = terminal
        self.columns = columns
        self.rows = rows
        self.unpaged = False  # set by emit_json: a JSON document is never paged

    def isatty(self) -> bool:
        return True

    def held(self) -> bytes:
        self.flush()
        return self.buffer.getvalue()  # type: ignore[attr-defined]


def hold_for_pager(no_pager: bool) -> None:
    """From now until `release_to_pager`, hold stdout when it is a terminal (the pager may get it)."""
    import shutil

    if no_pager or not sys.stdout.isatty() or isinstance(sys.stdout, HeldOutput):
        return
    size = shutil.get_terminal_size()
    sys.stdout.flush()
    sys.stdout = HeldOutput(sys.stdout, size.columns, size.lines)


def screen_lines(text: bytes, columns: int) -> int:
    """How many terminal lines ``text`` fills at ``columns`` wide (colour codes take none)."""
    count = 0
    for line in _ANSI.sub(b"", text).decode("utf-8", "replace").split("\n"):
        count += max(1, -(-len(line.expandtabs()) // max(columns, 1)))
    return count - (1 if text.endswith(b"\n") else 0)


def pager_command(config_pager: bool | str | None) -> str | None:
    """The pager to run, as git picks it, or None: none wanted (`cat` or empty is none)."""
    if config_pager is False:
        return None
    command = os.environ.get("SNAPVER_PAGER")
    if command is None and isinstance(config_pager, str):
        command = config_pager
    if command is None:
        command = os.environ.get("PAGER")
    if command is None:
        command = DEFAULT_PAGER
    return None if command.strip() in ("", "cat") else command


def release_to_pager() -> None:
    """Give back stdout; what was held goes to the terminal, or through the pager when it is
    longer than the screen (and not JSON, and the pager is not turned off)."""
    held = sys.stdout
    if not isinstance(held, HeldOutput):
        return
    sys.stdout = held.terminal
    data = held.held()
    if not data:
        return
    from snapver import interrupt

    command = None
    if not held.unpaged and not interrupt.requested() and screen_lines(data, held.columns) >= held.rows:
        command = pager_command(_configured_pager())
    if command is None or not _run_pager(command, data):
        sys.stdout.buffer.write(data)
        sys.stdout.flush()


def _configured_pager() -> bool | str | None:
    """`[ui] pager` of the config, or None (unset, or no config to read)."""
    from snapver.errors import SnapverError

    try:
        return STATE.config().pager
    except SnapverError:  # the command has already said what is wrong with the config
        return None


def _run_pager(command: str, data: bytes) -> bool:
    """Feed ``data`` to ``command`` (a shell command, as git runs it) and wait for it; False
    when it could not start (the output is then printed as it is)."""
    import signal
    import subprocess

    env = dict(os.environ)
    env.setdefault("LESS", "FRX")  # as git: raw colours, quit when it fits, keep the screen
    env.setdefault("LV", "-c")
    try:
        pager = subprocess.Popen(command, shell=True, stdin=subprocess.PIPE, env=env)
    except OSError:
        return False
    # Ctrl-C belongs to the pager now (less uses it to stop a search): we wait for it to end.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        assert pager.stdin is not None
        try:
            pager.stdin.write(data)
            pager.stdin.close()
        except BrokenPipeError:  # the reader quit before the end (q in less): fine
            pass
        code = pager.wait()
    finally:
        signal.signal(signal.SIGINT, previous)
    if code == 127:  # the shell did not find the pager
        print(f"snapver: pager {command!r} not found; printing without it", file=sys.stderr)
        return False
    return True
