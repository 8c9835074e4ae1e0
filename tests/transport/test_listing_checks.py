"""A node's listing is checked column by column (pure functions): it must refuse every
row the row-by-row check refuses, name the same row, and accept the same listings."""

from __future__ import annotations

import pytest

from snapver.model import StatEntry
from snapver.transport.base import _checked_rows, unsafe_listing_path

SRT = "sglang/srt"
OID = "0123456789abcdef0123456789abcdef01234567"
TRACKED = (SRT,)


def listing(count: int = 300) -> list[list]:
    """Rows as an agent sends them: files, links and a FIFO, in folders a few levels deep."""
    rows: list[list] = []
    for index in range(count):
        folder = f"{SRT}/layer{index % 7}/part{index % 3}"
        if index % 50 == 7:
            rows.append([f"{folder}/link{index}", "l", 0o120777, 6, 10, 11, 1000 + index, OID, "../a.py"])
        elif index % 97 == 5:
            rows.append([f"{folder}/fifo{index}", "s", 0o10644, 9, 10, 11, 1000 + index, OID, None])
        else:
            rows.append([f"{folder}/m {index}.py", "f", 0o100644, index, 10, 11, 1000 + index,
                         None if index % 4 == 0 else OID, None])
    return rows


def test_a_good_listing_gives_the_rows_as_they_came():
    rows = listing()
    assert _checked_rows(rows) == [StatEntry(*row) for row in rows]
    assert _checked_rows([]) == []


# (field index, bad value): each must be refused wherever it stands in the listing.
BAD_FIELDS = {
    "path not text": (0, 5),
    "path with a lone surrogate": (0, f"{SRT}/\ud800.py"),
    "mode as text": (2, "644"),
    "size missing": (3, None),
    "negative size": (3, -1),
    "size a bool": (3, True),
    "mtime a float": (4, 1.5),
    "ctime as text": (5, "11"),
    "inode missing": (6, None),
    "blob id in capitals": (7, OID.upper()),
    "blob id too short": (7, OID[:-1]),
    "blob id too long": (7, OID + "0"),
    "blob id with a space": (7, OID[:20] + " " + OID[21:]),
    "blob id not hex": (7, "g" + OID[1:]),
    "blob id not text": (7, 5),
    "empty blob id": (7, ""),
    "link target not text": (8, 5),
}


@pytest.mark.parametrize("where", [0, 150, 299])
@pytest.mark.parametrize("bad", list(BAD_FIELDS))
def test_a_bad_field_anywhere_is_refused_naming_its_row(bad, where):
    rows = listing()
    field, value = BAD_FIELDS[bad]
    rows[where][field] = value
    with pytest.raises((TypeError, ValueError, UnicodeError)) as caught:
        _checked_rows(rows)
    if not isinstance(caught.value, UnicodeError):
        assert repr(rows[where]) in str(caught.value)


@pytest.mark.parametrize("shape", ["short row", "long row", "tuple", "text of nine", "dict"])
def test_a_row_of_another_shape_is_refused(shape):
    rows = listing()
    good = rows[100]
    rows[100] = {"short row": good[:8], "long row": good + [None], "tuple": tuple(good),
                 "text of nine": "123456789", "dict": dict(enumerate(good))}[shape]
    with pytest.raises((TypeError, ValueError)):
        _checked_rows(rows)


def test_rows_not_in_a_list_are_refused():
    with pytest.raises(TypeError):
        _checked_rows({"a": 1})


def entries(*extra: tuple[str, str]) -> list[StatEntry]:
    """A good listing with ``(path, kind)`` rows inserted in its middle."""
    good = [StatEntry(*row) for row in listing()]
    added = [StatEntry(path, kind, 0o100644, 1, 0, 0, 1, OID, None) for path, kind in extra]
    return good[:150] + added + good[150:]


@pytest.mark.parametrize("path", [
    "../../evil.py", f"{SRT}/../../evil.py", f"{SRT}/./a.py", f"{SRT}/layer0/..", f"/{SRT}/a.py",
    f"{SRT}//a.py", f"{SRT}/a.py/", f"{SRT}/a\0.py", "sglang/evil.py", "sglang/srtx/a.py", SRT, "",
])
def test_an_unsafe_path_is_named(path):
    assert unsafe_listing_path(entries((path, "f")), TRACKED) == path


def test_a_path_listed_twice_is_named():
    assert unsafe_listing_path(entries((f"{SRT}/layer1/part1/m 1.py", "l")), TRACKED) == f"{SRT}/layer1/part1/m 1.py"


def test_an_unknown_kind_is_named():
    assert unsafe_listing_path(entries((f"{SRT}/dev", "d")), TRACKED) == f"{SRT}/dev"


@pytest.mark.parametrize("below", ["m 1.py/x.py", "m 1.py/deeper/x.py"])
def test_a_path_below_a_listed_one_is_named(below):
    # a file below a listed file or link would be written through that link in a checkout
    path = f"{SRT}/layer1/part1/{below}"
    assert unsafe_listing_path(entries((path, "f")), TRACKED) == path


def test_the_first_path_below_a_listed_one_is_named_even_when_the_link_comes_later():
    below, link = f"{SRT}/escape/victim.py", f"{SRT}/escape"
    assert unsafe_listing_path(entries((below, "f"), (link, "l")), TRACKED) == below


@pytest.mark.parametrize("path", [f"{SRT}/new\nline.py", f"{SRT}/.../a.py", f"{SRT}/..a.py", f"{SRT}/a..",
                                  f"{SRT}/\u00e9t\u00e9.py", f"{SRT}/layer0/part0/m 0.py.d/x.py"])
def test_safe_names_pass(path):
    assert unsafe_listing_path(entries((path, "f")), TRACKED) is None
