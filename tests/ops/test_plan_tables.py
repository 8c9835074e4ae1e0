"""The pure planners as tables (as pyinfra tests its operations): inputs -> expected steps,
no node and no store. The tables are tests/ops/plan_tables/*.json; each case says in its
name what it shows."""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

import pytest

from snapver.model import FILE, LINK, SPECIAL, Entry
from snapver.ops.patch import PatchFile
from snapver.ops.plan import Live, Step, classify, restore_steps, undo_steps

TABLES = Path(__file__).parent / "plan_tables"
TYPE_BITS = {FILE: stat.S_IFREG, LINK: stat.S_IFLNK, SPECIAL: stat.S_IFIFO}


def _cases(table: str) -> list[Any]:
    cases = json.loads((TABLES / f"{table}.json").read_text())["cases"]
    return [pytest.param(case, id=case["name"]) for case in cases]


def _parts(state: str) -> tuple[str, int, str]:
    """``f644:aaa`` -> kind, full st_mode, blob id (a link's bits are 0o777, as lstat says)."""
    head, _, oid = state.partition(":")
    kind, perms = head[0], int(head[1:] or "777", 8)
    return kind, TYPE_BITS[kind] | perms, oid


def entry(path: str, state: str | None) -> Entry | None:
    if state is None:
        return None
    kind, mode, oid = _parts(state)
    return Entry(path, kind, mode, len(oid), "", oid)


def live(state: str | None) -> Live | None:
    if state is None:
        return None
    if state == "other":
        return Live("other", None, stat.S_IFDIR | 0o755)
    kind, mode, oid = _parts(state)
    return Live(kind, oid, mode)


def _row(step: Step) -> list[Any]:
    return [step.path, step.action, step.note]


@pytest.mark.parametrize("case", _cases("classify"))
def test_classify(case: dict[str, Any]) -> None:
    base, patched = entry("pkg/a.py", case["base"]), entry("pkg/a.py", case["patch"])
    status = "A" if base is None else "D" if patched is None else "M"
    now = live(case["live"])
    step = classify(PatchFile("pkg/a.py", status, base, patched), now, case.get("force", False))
    wanted = case["step"]
    assert (step.action, step.note, step.keep_mode, step.forced) == \
        (wanted["action"], wanted["note"], wanted["keep_mode"], wanted["forced"])
    assert step.live == now and step.target == patched
    if "wire" in case:
        assert step.wire() == ["pkg/a.py", *case["wire"]]


@pytest.mark.parametrize("case", _cases("restore_steps"))
def test_restore_steps(case: dict[str, Any]) -> None:
    now = {path: live(state) for path, state in case["live"].items()}
    target = {path: entry(path, state) for path, state in case["target"].items()}
    steps = restore_steps(now, target)
    assert [_row(step) for step in steps] == case["steps"]
    for step in steps:
        assert step.live == now.get(step.path) and step.target == target.get(step.path)


@pytest.mark.parametrize("case", _cases("undo_steps"))
def test_undo_steps(case: dict[str, Any]) -> None:
    now = {path: live(state) for path, state in case["live"].items()}
    wrote = {path: entry(path, state) for path, state in case["wrote"].items()}
    before = {path: entry(path, state) for path, state in case["before"].items()}
    steps = undo_steps(now, wrote, before, case.get("force", False))
    assert [[*_row(step), step.forced] for step in steps] == case["steps"]
    for step in steps:
        assert step.live == now.get(step.path) and step.target == before.get(step.path)
