"""Results → text, tables and JSON: the only module that prints (besides errors)."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console

from snapver.cli.app import STATE


def console(stderr: bool = False) -> Console:
    """A console for stdout or stderr; off a terminal, lines are never wrapped or cut."""
    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 400
    return Console(stderr=stderr, no_color=not STATE.color, highlight=False, soft_wrap=True, width=width)


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
    """Make text safe for rich markup (and keep odd bytes printable)."""
    from rich.markup import escape as rich_escape

    return rich_escape(text.encode("utf-8", "backslashreplace").decode("utf-8"))


def print_error(error: Any) -> None:
    """A SnapverError met by one node of many, as `main` prints a fatal one: the line, then its hint."""
    err = console(stderr=True)
    err.print(f"snapver: error: {escape(error.message)}")
    if error.hint:
        err.print(f"hint: {escape(error.hint)}")
