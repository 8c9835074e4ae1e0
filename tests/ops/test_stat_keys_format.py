"""Stat keys as the node takes them (pure functions): records round-trip for any name a
file can have, an older version's object is refused (a miss), and a damaged file is refused."""

from __future__ import annotations

import json

import pytest

from snapver.model import StatEntry
from snapver.ops.live import _entries_records, parse_stat_keys, records_text, stat_keys_text

KEYS = [("sglang/srt/a b.py", 1, 2, 3, 4, 33188), ("sglang/srt/new\nline.py", 0, -5, 7, 8, 33261),
        ("sglang/srt/caf\udce9.py", 10**12, 1733000000123456789, 1733000000123456790, 2**40, 33188),
        ("sglang/srt/1 2 3 4 5", 6, 7, 8, 9, 10), ("sglang/srt/\u00e9t\u00e9/x.py", 3, 3, 3, 3, 3)]


def test_records_round_trip():
    text = stat_keys_text(KEYS)
    assert parse_stat_keys(text) == {path: tuple(key) for path, *key in KEYS}
    assert text.isascii() and json.loads(text).count("\0\0") == len(KEYS) - 1
    assert parse_stat_keys(stat_keys_text([])) == {}


def test_an_older_versions_object_is_refused():
    old = {path: list(key) for path, *key in KEYS}
    with pytest.raises(ValueError):
        parse_stat_keys(json.dumps(old))


@pytest.mark.parametrize("damaged", [
    "a", "a\0", "a\x001 2 3 4", "a\x001 2 3 4 5 6", "a\x001 2 3 4 5\0b", "a\x00x 2 3 4 5",
    "a\x001 2 3 4 5\0\0\0b\x001 2 3 4 5", "a\x001 2 3 4 5\0\0",
])
def test_damaged_records_are_refused(damaged):
    with pytest.raises(ValueError):
        parse_stat_keys(json.dumps(damaged))


def test_neither_records_nor_an_object_is_refused():
    with pytest.raises(ValueError):
        parse_stat_keys("[1, 2]")


def test_records_sorted_by_path_are_the_records_sorted():
    """A pull writes the records of its files sorted by path (``_entries_records``) and the
    node sorts the records themselves: both orders must be one (a NUL sorts before any
    character of a path), for names that are prefixes of others, control characters,
    non-ASCII and undecodable bytes."""
    names = ["a", "a.b", "a/b", "a b", "a\tb", "a\x01", "a0", "\u00e9", "\udce9x", "Z", "z/y", "ab", "a-b/c", "a/b/c"]
    entries = [StatEntry(name, "f", 33188, len(name), 10**18 + i, 10**18 - i, 2**40 + i, "0" * 40)
               for i, name in enumerate(names)]
    keys = [(e.path, e.size, e.mtime_ns, e.ctime_ns, e.ino, e.mode) for e in entries]
    assert _entries_records(sorted(entries, key=lambda e: e.path)) == records_text(keys)
