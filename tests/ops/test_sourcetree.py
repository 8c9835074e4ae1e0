"""Pure tables: a node's git ``ls-tree`` answer as a committed tree, and a live tree against it."""

from __future__ import annotations

import pytest

from snapver.model import FILE, LINK, Entry, Manifest
from snapver.ops.sourcetree import CommittedTree, committed_tree, compare_with_commit

A, B, C = "a" * 40, "b" * 40, "c" * 40
PATHS, EXCLUDE = ("sglang/srt",), ("__pycache__/", "*.pyc")


def answer(*rows: list[str], **extra: object) -> dict:
    return {"checkout": "/w/sglang", "commit": "1" * 40, "tag": "v0.5.23", "entries": [list(r) for r in rows], **extra}


def test_an_answer_keeps_tracked_files_and_links_only() -> None:
    tree = committed_tree(answer(["100644", A, "sglang/srt/a.py"], ["100755", B, "sglang/srt/run.sh"],
                                 ["120000", C, "sglang/srt/link"], ["160000", A, "sglang/srt/sub"],
                                 ["100644", A, "sglang/srt/__pycache__/a.cpython-311.pyc"],
                                 ["100644", A, "sglang/lang/x.py"]), PATHS, EXCLUDE)
    assert isinstance(tree, CommittedTree)
    assert tree.entries == {"sglang/srt/a.py": (FILE, A), "sglang/srt/run.sh": (FILE, B),
                            "sglang/srt/link": (LINK, C)}
    assert (tree.label, tree.name) == ("git v0.5.23 (1111111)", "git v0.5.23")


@pytest.mark.parametrize(("reply", "problem"), [
    ({"problem": "no git on the node to read the checkout /w/sglang"}, "no git on the node"),
    (answer(), "holds none of sglang/srt"),
    (answer(["100644", A, "sglang/srt/a.py"], commit="HEAD"), "unreadable"),
    (answer(["100644", "sglang/srt/a.py"]), "unreadable"),
])
def test_an_answer_that_gives_no_tree_is_its_reason(reply: dict, problem: str) -> None:
    found = committed_tree(reply, PATHS, EXCLUDE)
    assert isinstance(found, str) and problem in found


def entry(path: str, oid: str, kind: str = FILE) -> Entry:
    return Entry(path, kind, 0o100644 if kind == FILE else 0o120777, 1, "", oid)


def test_live_against_committed() -> None:
    tree = CommittedTree("/w", "1" * 40, "", {"sglang/srt/same.py": (FILE, A), "sglang/srt/edited.py": (FILE, A),
                                              "sglang/srt/gone.py": (FILE, A), "sglang/srt/link": (LINK, B)})
    live = Manifest.of([entry("sglang/srt/same.py", A), entry("sglang/srt/edited.py", C),
                        entry("sglang/srt/link", B, LINK), entry("sglang/srt/new.py", A)])
    assert compare_with_commit(tree, live) == [("sglang/srt/edited.py", "M"), ("sglang/srt/gone.py", "D"),
                                               ("sglang/srt/new.py", "A")]
    swapped = Manifest.of([*live, entry("sglang/srt/link", B, FILE)])
    assert ("sglang/srt/link", "T") in compare_with_commit(tree, swapped)
