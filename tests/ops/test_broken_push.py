"""Never deploy a broken patch: a file with unresolved conflict markers, or a `.py` file
the node's own Python does not compile, refuses the push before anything is written
(`--force` does not skip it, `--allow-broken` does and is recorded); `patch save`,
`import` and `rebase` warn at once. Real sshd nodes, real `git merge-file` markers, the
node's real interpreter (pyenv's 3.8 where the machine has it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

MOD = "sglang/srt/mod.py"
PY38 = Path("/root/.pyenv/versions/3.8.18/bin/python3.8")


def records(store: Path, node: str) -> list[dict]:
    done = subprocess.run(["git", "--git-dir", str(store), "log", "--format=%B%x00", f"refs/heads/pushes/{node}",
                           "--"], capture_output=True, text=True)
    out = done.stdout if done.returncode == 0 else ""  # no record yet: no such ref
    return [json.loads(line[len("snapver-meta: "):]) for body in out.split("\0")
            for line in body.splitlines() if line.startswith("snapver-meta: ")]


def diff(path: str, old: str, new: str) -> str:
    return (f"--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-{old}\n+{new}\n")


@pytest.fixture
def node(sshd, ssh_node, make_site_packages, write_config, tmp_path: Path):
    site = make_site_packages("ct200", files={MOD: "x = 1\n", "sglang/srt/other.py": "y = 1\n"})
    write_config({"ct200": ssh_node("ct200", site)}, where=tmp_path)
    return site


def test_conflict_markers_left_by_a_rebase_are_never_pushed(node: Path, run_snapver, tmp_path: Path) -> None:
    """Issue 14, reproduction 1: rebase conflicts, `patch save` keeps the markers, push wrote them."""
    run = lambda *a: run_snapver(*a, cwd=tmp_path)  # noqa: E731
    assert run("pull", "ct200").code == 0
    (tmp_path / "conf.diff").write_text(diff(MOD, "x = 1", "x = 2"))
    assert run("patch", "import", "conf", "conf.diff", "--base", "ct200", "--nodes", "ct200").code == 0
    (node / MOD).write_text("x = 3\n")  # the new release changed the same line
    assert run("pull", "ct200").code == 0
    rebased = run("patch", "rebase", "conf", "--onto", "ct200")
    assert rebased.code == 1 and "conflict" in rebased.out
    saved = run("patch", "save", "conf")  # the markers are still in the checkout
    assert saved.code == 0
    assert f"warning: {MOD}:1: unresolved conflict marker '<<<<<<< conf'" in saved.err
    for extra in ([], ["--force"]):
        refused = run("push", "conf", "ct200", "--yes", *extra)
        assert refused.code == 1, refused
        assert f"{MOD}:1: unresolved conflict marker '<<<<<<< conf'" in refused.err
        assert "no node was changed" in refused.err
        assert (node / MOD).read_text() == "x = 3\n"
    assert not records(tmp_path / "snapshots", "ct200")
    pushed = run("push", "conf", "ct200", "--yes", "--allow-broken")
    assert pushed.code == 0, pushed
    assert "<<<<<<< conf" in (node / MOD).read_text()
    compiled = subprocess.run([sys.executable, "-m", "py_compile", str(node / MOD)], capture_output=True, text=True)
    assert compiled.returncode == 1 and "SyntaxError" in compiled.stderr  # what it refused to deploy
    record = records(tmp_path / "snapshots", "ct200")[0]
    assert record["allow_broken"] is True and record["state"] == "done"
    assert record["broken"][0] == f"{MOD}:1: unresolved conflict marker '<<<<<<< conf'"
    assert record["broken"][1].startswith(f"{MOD}:") and "SyntaxError" in record["broken"][1]


def test_python_that_does_not_compile_is_refused_with_line_and_message(node: Path, run_snapver,
                                                                        tmp_path: Path) -> None:
    run = lambda *a: run_snapver(*a, cwd=tmp_path)  # noqa: E731
    assert run("pull", "ct200").code == 0
    (tmp_path / "bad.diff").write_text(diff(MOD, "x = 1", "def f(:") + diff("sglang/srt/other.py", "y = 1", "y = 2"))
    imported = run("patch", "import", "bad", "bad.diff", "--base", "ct200")
    assert imported.code == 0
    assert f"warning: {MOD}:1: SyntaxError:" in imported.err
    refused = run("push", "bad", "ct200", "--yes", "--force")
    assert refused.code == 1
    assert f"{MOD}:1: SyntaxError: " in refused.err and "(on ct200's Python)" in refused.err
    assert (node / MOD).read_text() == "x = 1\n" and (node / "sglang/srt/other.py").read_text() == "y = 1\n"
    assert subprocess.run([sys.executable, "-m", "compileall", "-q", str(node)], capture_output=True).returncode == 0
    dry = run("push", "bad", "ct200", "--dry-run", "--json")
    assert dry.code == 1
    assert [b["path"] for b in json.loads(dry.out)["broken"]] == [MOD]


def test_a_forced_file_that_does_not_compile_is_still_refused(node: Path, run_snapver, tmp_path: Path) -> None:
    """The node's file was hot-fixed (a conflict), so `--force` is what writes it: forcing
    overrides the conflict, never the compile check; only `--allow-broken` lets it land."""
    run = lambda *a: run_snapver(*a, cwd=tmp_path)  # noqa: E731
    assert run("pull", "ct200").code == 0
    (tmp_path / "bad.diff").write_text(diff(MOD, "x = 1", "def f(:"))
    assert run("patch", "import", "bad", "bad.diff", "--base", "ct200", "--nodes", "ct200").code == 0
    (node / MOD).write_text("x = 9\n")  # hot-fixed by hand: neither the base nor the patch
    refused = run("push", "bad", "ct200", "--yes", "--force")
    assert refused.code == 1, refused
    assert f"{MOD}:1: SyntaxError: " in refused.err and "(on ct200's Python)" in refused.err, refused
    assert (node / MOD).read_text() == "x = 9\n"
    assert not records(tmp_path / "snapshots", "ct200")
    pushed = run("push", "bad", "ct200", "--yes", "--force", "--allow-broken")
    assert pushed.code == 0, pushed
    assert (node / MOD).read_text() == "def f(:\n"
    assert records(tmp_path / "snapshots", "ct200")[0]["allow_broken"] is True


def test_a_lone_rst_underline_in_a_docstring_is_no_conflict_marker(node: Path, run_snapver, tmp_path: Path) -> None:
    """A docstring title underlined with exactly seven `=` is a reStructuredText heading, not
    a merge conflict: `patch import` does not warn and the push writes it. (Only a set of
    `<<<<<<<` / `=======` / `>>>>>>>` lines is refused.)"""
    run = lambda *a: run_snapver(*a, cwd=tmp_path)  # noqa: E731
    assert run("pull", "ct200").code == 0
    new = '"""\n+Summary\n+=======\n+\n+Fast paths.\n+"""\n+x = 2'
    (tmp_path / "doc.diff").write_text(f"--- a/{MOD}\n+++ b/{MOD}\n@@ -1 +1,7 @@\n-x = 1\n+{new}\n")
    imported = run("patch", "import", "doc", "doc.diff", "--base", "ct200", "--nodes", "ct200")
    assert imported.code == 0 and "warning" not in imported.err, imported
    pushed = run("push", "doc", "ct200", "--yes")
    assert pushed.code == 0, pushed
    assert (node / MOD).read_text() == '"""\nSummary\n=======\n\nFast paths.\n"""\nx = 2\n'


def test_the_node_python_decides(sshd, ssh_node, make_site_packages, write_config, run_snapver,
                                 tmp_path: Path) -> None:
    """`match` compiles here (3.11) but not on a 3.8 node: the node's Python is the judge."""
    python = PY38 if PY38.exists() else Path(sys.executable)
    site = make_site_packages("ct200", files={MOD: "x = 1\n"})
    write_config({"ct200": ssh_node("ct200", site, python=str(python))}, where=tmp_path)
    run = lambda *a: run_snapver(*a, cwd=tmp_path)  # noqa: E731
    assert run("pull", "ct200").code == 0
    new = "match x:\n+    case 1:\n+        y = 2"
    (tmp_path / "m.diff").write_text(f"--- a/{MOD}\n+++ b/{MOD}\n@@ -1 +1,3 @@\n-x = 1\n+{new}\n")
    imported = run("patch", "import", "m", "m.diff", "--base", "ct200")
    assert imported.code == 0 and "warning" not in imported.err  # fine for this Python
    result = run("push", "m", "ct200", "--yes")
    if python == PY38:
        assert result.code == 1
        assert f"{MOD}:1: SyntaxError: invalid syntax (on ct200's Python)" in result.err
        assert (site / MOD).read_text() == "x = 1\n"
    else:
        assert result.code == 0, result


def test_the_compile_op_holds_one_bounded_file_at_a_time(node: Path, tmp_path: Path) -> None:
    """The agent compiles each streamed source on its own; one larger than it holds at once
    is listed unchecked (never read into memory), and the session stays in step."""
    from snapver.config import load_config
    from snapver.transport.agent.writing import COMPILE_MAX
    from snapver.transport.connect import open_transport

    spec = load_config(str(tmp_path / ".snapver")).nodes["ct200"]
    sources = [("sglang/srt/bad.py", b"x = 1\ndef f(:\n"), ("sglang/srt/big.py", b"#" * (COMPILE_MAX + 1)),
               ("sglang/srt/ok.py", b"# -*- coding: latin-1 -*-\ns = '\xe9'\n"), ("sglang/srt/nul.py", b"x = 1\0\n")]
    with open_transport(spec) as transport:
        errors, unchecked = transport.compile_sources(sources)
        assert sorted(errors) == ["sglang/srt/bad.py", "sglang/srt/nul.py"]
        assert errors["sglang/srt/bad.py"][0] == 2 and errors["sglang/srt/bad.py"][1].startswith("SyntaxError: ")
        assert unchecked == ["sglang/srt/big.py"]
        assert [e.path for e in transport.list_tree().entries] == ["sglang/srt/mod.py", "sglang/srt/other.py"]
