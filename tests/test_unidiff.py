"""Reading `diff -ruN` headers: a side dated at the Unix epoch is a missing file, whatever
zone the header's timestamp is written in (GNU diff writes local time with its offset)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from snapver.unidiff import parse_diff


def _headers(old_stamp: str, new_stamp: str, old_count: int = 0, new_count: int = 1) -> bytes:
    body = b"+x = 1\n" if new_count else b"-x = 1\n"
    return (f"--- old/sglang/srt/x.py\t{old_stamp}\n+++ new/sglang/srt/x.py\t{new_stamp}\n"
            f"@@ -{min(old_count, 1)},{old_count} +{min(new_count, 1)},{new_count} @@\n").encode() + body


NOW = "2026-05-22 10:11:12.123456789 +0000"


@pytest.mark.parametrize(("stamp", "is_epoch"), [
    ("1970-01-01 00:00:00.000000000 +0000", True),
    ("1970-01-01 00:00:00 +0000", True),
    ("1970-01-01 00:00:00", True),  # no zone: read as UTC
    ("1970-01-01 05:30:00.000000000 +0530", True),  # the epoch, written in India
    ("1969-12-31 19:00:00.000000000 -0500", True),  # the epoch, written in New York
    ("1970-01-01 00:00:00.000000000 +0530", False),  # 5h30 before it
    ("1970-01-01 00:00:00.000000000 -0500", False),  # 5h after it
    ("1970-01-01 05:30:00.000000000 -0530", False),  # the offset's sign read the wrong way round
    ("1970-01-01 00:00:01 +0000", False),
])
def test_a_side_at_the_epoch_in_any_zone_is_absent(stamp: str, is_epoch: bool) -> None:
    created = parse_diff(_headers(stamp, NOW)).files[0]
    assert created.created is is_epoch and created.new_path == "new/sglang/srt/x.py"
    deleted = parse_diff(_headers(NOW, stamp, old_count=1, new_count=0)).files[0]
    assert deleted.deleted is is_epoch and deleted.old_path == "old/sglang/srt/x.py"


@pytest.mark.parametrize("zone", ["UTC", "Asia/Kolkata", "America/New_York"])
def test_gnu_diff_ruN_in_a_zone_marks_new_and_deleted_files(tmp_path: Path, zone: str) -> None:
    """GNU `diff -ruN` run with TZ set: its epoch headers carry that zone's offset."""
    for side, name in (("old", "gone.py"), ("new", "fresh.py")):
        (tmp_path / side / "sglang/srt").mkdir(parents=True)
        (tmp_path / side / "sglang/srt" / name).write_text(f"{name} = 1\n")
    output = subprocess.run(["diff", "-ruN", "old", "new"], cwd=tmp_path, capture_output=True,
                            env={**os.environ, "TZ": zone}).stdout
    if zone != "UTC":
        assert b" +0000" not in output  # the zone really is in the headers
    files = {(f.old_path, f.new_path): (f.created, f.deleted) for f in parse_diff(output).files}
    assert files == {(None, "new/sglang/srt/fresh.py"): (True, False),
                     ("old/sglang/srt/gone.py", None): (False, True)}, (files, output)
