"""The node range expander (snapver/noderange.py), as tables."""

from __future__ import annotations

import pytest

from snapver.noderange import MAX_NAMES, RangeError, expand, is_range, split_top


@pytest.mark.parametrize("text, names", [
    ("ct200", ["ct200"]),
    ("ct[200-203]", ["ct200", "ct201", "ct202", "ct203"]),
    ("ct[200-201,210]", ["ct200", "ct201", "ct210"]),
    ("gpu[01-03]", ["gpu01", "gpu02", "gpu03"]),
    ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
    ("gpu[001-002]", ["gpu001", "gpu002"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[0-1]", ["n0", "n1"]),
    ("fleet[00-02]", ["fleet00", "fleet01", "fleet02"]),
    ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
    ("ct[1-2].dc", ["ct1.dc", "ct2.dc"]),
    ("a,ct[1-2],b", ["a", "ct1", "ct2", "b"]),
    ("ct[1-2],ct[2-3]", ["ct1", "ct2", "ct3"]),  # in order, without repeats
    ("ct[5]", ["ct5"]),
    ("ct[1-2]@live", ["ct1@live", "ct2@live"]),
])
def test_ranges_expand(text, names):
    assert expand(text) == names


@pytest.mark.parametrize("text, message", [
    ("ct[7-2]", "runs backwards (write 2-7)"),
    ("ct[a-b]", "'a-b' is not a number or a low-high span of numbers"),
    ("ct[1-100000]", f"names more than {MAX_NAMES:,} nodes"),
    ("r[1-1000]n[1-1000]", f"names more than {MAX_NAMES:,} nodes"),
    ("ct[1-2", "a '[' without its ']'"),
    ("ct1-2]", "a ']' without its '['"),
    ("ct[]", "an empty '[]'"),
    ("ct[[1-2]]", "brackets cannot nest"),
    ("ct[1-2],,a", "an empty name between commas"),
    ("ct[-1]", "is not a number"),
])
def test_bad_ranges_say_what_is_wrong(text, message):
    with pytest.raises(RangeError) as caught:
        expand(text)
    assert message in str(caught.value) and repr(text) in str(caught.value)


def test_the_cap_is_exact():
    assert len(expand(f"n[1-{MAX_NAMES}]")) == MAX_NAMES
    with pytest.raises(RangeError):
        expand(f"n[0-{MAX_NAMES}]")


def test_split_and_detect():
    assert split_top("a,ct[1,2],b") == ["a", "ct[1,2]", "b"]
    assert is_range("ct[1-2]") and is_range("a,b") and not is_range("ct200") and not is_range("ct200@live")
