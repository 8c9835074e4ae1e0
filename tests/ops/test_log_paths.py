"""`log -- PATH` (the snapshots where a file changed, as `git log -- PATH` finds them in
the store), `log -p` and `log --stat` (each snapshot against its parent snapshot)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from snapver_inproc import run_inproc

SRT = "sglang/srt"
A = f"{SRT}/layers/a.py"
B = f"{SRT}/b.py"


@pytest.fixture
def history(make_site_packages, ssh_node, write_config) -> Path:
    """ct200 over SSH pulled four times: first, A changed, B changed, A changed again;
    and ct129 once (its snapshots never show in ct200's log)."""
    site = make_site_packages("ct200", files={A: "one\n", B: "b\n"})
    other = make_site_packages("ct129", files={A: "other\n"})
    write_config({"ct200": ssh_node("ct200", site), "ct129": ssh_node("ct129", other)})
    assert run_inproc("pull", "ct200", "ct129").code == 0
    for path, text in ((A, "one\ntwo\n"), (B, "B\n"), (A, "ONE\ntwo\n")):
        (site / path).write_text(text)
        assert run_inproc("pull", "ct200").code == 0
    return Path("snapshots")


def git_log(store: Path, *args: str) -> list[str]:
    done = subprocess.run(["git", "--git-dir", str(store), "log", "--format=%H", *args],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def test_log_path_lists_the_snapshots_where_the_file_changed(history: Path) -> None:
    for operand in ("a.py", "layers/a.py", A, "layers"):
        result = run_inproc("log", "ct200", "--json", "--", operand)
        assert result.code == 0, (operand, result)
        listed = [s["id"] for s in json.loads(result.out)["snapshots"]]
        assert listed == git_log(history, "refs/heads/nodes/ct200", "--", A), operand
        assert len(listed) == 3
    limited = json.loads(run_inproc("log", "ct200", "-n", "1", "--json", "--", "a.py").out)["snapshots"]
    assert [s["id"] for s in limited] == git_log(history, "-n", "1", "refs/heads/nodes/ct200", "--", A)
    every = json.loads(run_inproc("log", "--json", "--", B).out)["snapshots"]
    assert [s["id"] for s in every] == git_log(history, "refs/heads/nodes/ct200", "--", B)
    missing = run_inproc("log", "--", "layers/aa.py")
    assert missing.code == 2 and f"did you mean {A}" in missing.err, missing


def test_log_p_shows_each_snapshots_diff_from_its_parent(history: Path) -> None:
    result = run_inproc("log", "ct200", "-p", "--", "a.py")
    assert result.code == 0, result
    newest, middle, first = git_log(history, "refs/heads/nodes/ct200", "--", A)
    sections = result.out.split(f"diff --git a/{A} b/{A}\n")
    assert len(sections) == 4, result.out
    assert "-one\n+ONE\n" in sections[1] and newest[:10] in sections[0]
    assert "+two\n" in sections[2] and middle[:10] in sections[1]
    assert "new file mode 100644" in sections[3] and "+one\n" in sections[3] and first[:10] in sections[2]
    assert B not in result.out  # only the paths asked for


def test_log_stat_gives_each_snapshot_a_diffstat(history: Path) -> None:
    result = run_inproc("log", "ct200", "--stat")
    assert result.code == 0, result
    lines = result.out.splitlines()
    assert sum(" | " in line for line in lines) == 5, result.out  # 2 first, then 1, 1, 1
    assert sum("file changed" in line or "files changed" in line for line in lines) == 4
    document = json.loads(run_inproc("log", "ct200", "-n", "1", "--stat", "--json").out)
    change = document["snapshots"][0]["changes"]
    assert [(c["path"], c["added"], c["removed"]) for c in change] == [(A, 1, 1)]
    both = run_inproc("log", "-p", "--stat")
    assert both.code == 2 and "Traceback" not in both.err
