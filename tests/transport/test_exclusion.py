"""The exclude rules one function applies everywhere (agent walk, verify, patch checkouts)."""

from __future__ import annotations

import pytest

from snapver.transport.agent.listing import exclusion

CASES = [
    # patterns, name, relpath, is_dir, excluded?
    (["__pycache__/", "*.pyc"], "__pycache__", "sglang/srt/__pycache__", True, True),
    (["__pycache__/", "*.pyc"], "__pycache__", "sglang/srt/__pycache__", False, False),  # dir-only
    (["__pycache__/", "*.pyc"], "a.pyc", "sglang/srt/a.pyc", False, True),
    (["__pycache__/", "*.pyc"], "a.pyc", "sglang/srt/a.pyc", True, True),
    (["__pycache__/", "*.pyc"], "a.py", "sglang/srt/a.py", False, False),
    (["*.PYC"], "a.pyc", "sglang/srt/a.pyc", False, False),  # case matters, as fnmatchcase
    (["sglang/srt/layers/*.so"], "x.so", "sglang/srt/layers/x.so", False, True),
    (["sglang/srt/layers/*.so"], "x.so", "sglang/srt/x.so", False, False),  # a path pattern is anchored
    (["/sglang/srt/big/"], "big", "sglang/srt/big", True, True),
    (["/sglang/srt/big/"], "big", "sglang/srt/big", False, False),
    (["/sglang/srt/big/"], "big", "sglang/srt/other/big", True, False),
    (["te?t[0-9].py"], "test1.py", "sglang/srt/test1.py", False, True),
    (["te?t[0-9].py"], "test12.py", "sglang/srt/test12.py", False, False),
    (["a b*"], "a b c", "sglang/srt/a b c", False, True),
    (["*"], "x\ny", "sglang/srt/x\ny", False, True),  # names with newlines match like any other
    ([], "a.pyc", "sglang/srt/a.pyc", False, False),
]


@pytest.mark.parametrize(("patterns", "name", "relpath", "is_dir", "expected"), CASES)
def test_exclusion(patterns: list[str], name: str, relpath: str, is_dir: bool, expected: bool) -> None:
    assert exclusion(patterns)(name, relpath, is_dir) is expected
