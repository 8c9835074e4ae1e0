"""Node ranges, as SLURM and ClusterShell write them: ``ct[200-207,210]``, ``gpu[01-16]``.

Pure text to names, no I/O. A bracket holds numbers and ``low-high`` spans separated by
commas; a low bound written with leading zeros pads every number of its span to its
width (``gpu[01-16]`` → ``gpu01`` … ``gpu16``). Several brackets multiply
(``r[1-2]n[1-2]`` → ``r1n1 r1n2 r2n1 r2n2``); commas outside brackets separate ranges.
Names never hold brackets (config.py), so a name without one is itself.
"""

from __future__ import annotations

import re

MAX_NAMES = 10_000  # one range names at most this many (a typo such as [1-100000] is refused)

_SPAN = re.compile(r"^(\d+)(?:-(\d+))?$")


class RangeError(ValueError):
    """A range that names nothing sensible: the message says what and where."""


def is_range(text: str) -> bool:
    """True when ``text`` holds a bracket (or a comma), so it names several names."""
    return "[" in text or "]" in text or "," in text


def split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets (``a,ct[1,2]`` → ``a``, ``ct[1,2]``)."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def expand(text: str) -> list[str]:
    """The names ``text`` stands for, in order, without repeats; RangeError when it is not
    a well-formed range or names more than MAX_NAMES."""
    limit = MAX_NAMES
    names: dict[str, None] = {}
    for part in split_top(text):
        if not part:
            raise RangeError(f"{text!r}: an empty name between commas")
        for name in _expand_one(part, text, limit - len(names)):
            names[name] = None
        if len(names) > limit:
            raise RangeError(f"{text!r} names more than {MAX_NAMES:,} nodes")
    return list(names)


def _expand_one(part: str, whole: str, limit: int) -> list[str]:
    """One comma-free range: its text before the first bracket, times the bracket's
    numbers, times the rest (expanded the same way)."""
    opening = part.find("[")
    closing = part.find("]")
    if opening < 0:
        if closing >= 0:
            raise RangeError(f"{whole!r}: a ']' without its '['")
        return [part]
    closing = part.find("]", opening)
    if closing < 0:
        raise RangeError(f"{whole!r}: a '[' without its ']'")
    inner = part[opening + 1:closing]
    if "[" in inner:
        raise RangeError(f"{whole!r}: brackets cannot nest")
    numbers = _numbers(inner, whole, limit)
    rest = _expand_one(part[closing + 1:], whole, max(1, limit // max(1, len(numbers))))
    if len(numbers) * len(rest) > limit:
        raise RangeError(f"{whole!r} names more than {MAX_NAMES:,} nodes")
    head = part[:opening]
    return [f"{head}{number}{tail}" for number in numbers for tail in rest]


def _numbers(inner: str, whole: str, limit: int) -> list[str]:
    """The numbers of one bracket, as text (zero padding kept)."""
    if not inner:
        raise RangeError(f"{whole!r}: an empty '[]'")
    numbers: list[str] = []
    for span in inner.split(","):
        match = _SPAN.match(span.strip())
        if match is None:
            raise RangeError(f"{whole!r}: {span!r} is not a number or a low-high span of numbers")
        low_text, high_text = match.group(1), match.group(2) or match.group(1)
        low, high = int(low_text), int(high_text)
        if high < low:
            raise RangeError(f"{whole!r}: the span {span!r} runs backwards (write {high_text}-{low_text})")
        if len(numbers) + high - low + 1 > limit:
            raise RangeError(f"{whole!r} names more than {MAX_NAMES:,} nodes")
        width = len(low_text) if low_text.startswith("0") and len(low_text) > 1 else 0
        numbers.extend(str(n).zfill(width) for n in range(low, high + 1))
    return numbers
