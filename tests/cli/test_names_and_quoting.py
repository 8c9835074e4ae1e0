"""Names users give (tags, patches) and names files have, on the way in and out.

A tag or patch that spells a hex id would shadow the snapshot it spells (names are looked
up first); a name too long for a ref file used to be an internal error. File names with
a newline or an escape sequence are printed C-quoted, as git prints them, by every
command that lists paths: a name can neither forge a line nor drive the terminal.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from snapver_inproc import run_inproc

SRT = "sglang/srt"
NEWLINE_NAME = f"{SRT}/evil\nM\tsglang/srt/forged.py"
ESC_NAME = f"{SRT}/esc\x1b[2J\x1b[31mred.py"


def git_id(store: Path, rev: str) -> str:
    return subprocess.run(["git", "--git-dir", str(store), "rev-parse", rev], capture_output=True, text=True,
                          check=True).stdout.strip()


@pytest.fixture
def two_nodes(make_site_packages, local_node, write_config, tmp_path: Path) -> dict:
    n1 = make_site_packages("n1", files={f"{SRT}/a.py": "a = 1\n"})
    n2 = make_site_packages("n2", files={f"{SRT}/a.py": "a = 2\n"})
    write_config({"n1": local_node(n1), "n2": local_node(n2)})
    assert run_inproc("pull", "n1", "n2").code == 0
    store = Path.cwd() / "snapshots"
    return {"store": store, "n1": n1, "n2": n2, "n1_id": git_id(store, "refs/heads/nodes/n1")}


def assert_one_line_error(result, code: int, *words: str) -> None:
    lines = result.err.splitlines()
    assert result.code == code, result
    assert lines[0].startswith("snapver: error: ") and all(w in lines[0] for w in words), result
    assert len(lines) <= 2 and all(line.startswith("hint: ") for line in lines[1:]), result
    assert "internal error" not in result.err and "Traceback" not in result.err


def test_a_tag_that_spells_a_snapshot_id_is_refused(two_nodes: dict) -> None:
    n1_id = two_nodes["n1_id"]
    # Tagging n2's snapshot with n1's id would make that id name n2's snapshot from now on.
    for name in (n1_id, n1_id[:12], "abcd", "2026"):
        assert_one_line_error(run_inproc("tag", name, "n2"), 2, "looks like a snapshot id")
    assert_one_line_error(run_inproc("pull", "n1", "--tag", n1_id[:8]), 2, "looks like a snapshot id")
    assert subprocess.run(["git", "--git-dir", str(two_nodes["store"]), "tag", "-l"], capture_output=True,
                          text=True).stdout == ""
    shown = run_inproc("show", n1_id)
    assert shown.code == 0 and "node:          n1 " in shown.out
    # Names with a letter beyond f, or a dash, are names.
    assert run_inproc("tag", "abcd-before", "n2").code == 0
    assert run_inproc("tag", "v2026", "n2").code == 0


def test_a_patch_that_spells_a_hex_id_is_refused(two_nodes: dict, tmp_path: Path) -> None:
    diff = tmp_path / "fix.diff"
    diff.write_text(f"--- a/{SRT}/a.py\n+++ b/{SRT}/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 10\n")
    assert_one_line_error(run_inproc("patch", "import", "cafe1234", diff, "--base", "n1"), 2,
                          "looks like a snapshot id")
    assert_one_line_error(run_inproc("patch", "new", "beef", "--base", "n1"), 2, "looks like a snapshot id")
    refs = subprocess.run(["git", "--git-dir", str(two_nodes["store"]), "for-each-ref", "refs/heads/patches/"],
                          capture_output=True, text=True, check=True).stdout
    assert refs == ""


@pytest.mark.parametrize("length", [101, 300, 5000])
def test_too_long_names_exit_2_in_one_line(two_nodes: dict, tmp_path: Path, length: int) -> None:
    name = "p" * length
    diff = tmp_path / "fix.diff"
    diff.write_text(f"--- a/{SRT}/a.py\n+++ b/{SRT}/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 10\n")
    for args in (("tag", name, "n1"), ("pull", "n1", "--tag", name), ("patch", "new", name, "--base", "n1"),
                 ("patch", "import", name, diff, "--base", "n1"), ("patch", "save", name)):
        result = run_inproc(*args)
        assert_one_line_error(result, 2, "is too long", f"({length} characters)")
        assert len(result.err) < 300  # the name is cut short in the message, not repeated whole
    assert not (Path.cwd() / ".snapver-patches").exists() or not any((Path.cwd() / ".snapver-patches").iterdir())
    assert run_inproc("tag", "p" * 100, "n1").code == 0  # the longest name kept


def test_file_names_with_control_characters_are_quoted_everywhere(make_site_packages, local_node,
                                                                  write_config) -> None:
    site = make_site_packages("n1", files={f"{SRT}/a.py": "a = 1\n", NEWLINE_NAME: "x = 1\n", ESC_NAME: "y = 1\n"})
    write_config({"n1": local_node(site)})
    assert run_inproc("pull", "n1", "-m", "note\x1b]0;owned\x07").code == 0
    (site / NEWLINE_NAME).write_text("x = 2\n")
    (site / ESC_NAME).write_text("y = 2\n")
    quoted_newline = '"sglang/srt/evil\\nM\\tsglang/srt/forged.py"'
    quoted_esc = '"sglang/srt/esc\\033[2J\\033[31mred.py"'

    status = run_inproc("status", "n1")
    assert status.code == 1, status
    assert f"  M  {quoted_esc}" in status.out.splitlines()  # no RECORD: changed, not labelled
    assert f"  M  {quoted_newline}" in status.out.splitlines()
    name_status = run_inproc("diff", "n1", "--name-status")
    assert name_status.out.splitlines() == [f"M\t{quoted_esc}", f"M\t{quoted_newline}"]
    stat = run_inproc("diff", "n1", "--stat")
    assert quoted_newline in stat.out and quoted_esc in stat.out
    log = run_inproc("log")
    assert '"note\\033]0;owned\\a"' in log.out
    for result in (status, name_status, stat, log):
        assert "\x1b" not in result.out and "forged.py\n" not in result.out.replace(quoted_newline, "")
    # Quoted names read back the way git reads its own: `git diff --name-status` prints the same.
    store = Path.cwd() / "snapshots"
    assert run_inproc("pull", "n1").code == 0
    by_git = subprocess.run(["git", "--git-dir", str(store), "diff", "--name-status", "refs/heads/nodes/n1~1",
                             "refs/heads/nodes/n1", "--", SRT], capture_output=True, text=True,
                            check=True).stdout
    assert by_git.splitlines() == [f"M\t{quoted_esc}", f"M\t{quoted_newline}"]


def test_json_output_is_utf8_and_gives_back_the_bytes_of_a_name_that_is_not(make_site_packages, local_node,
                                                                              write_config) -> None:
    """A file name that is not UTF-8 (bytes a Linux name may hold) is written into JSON as
    the escape of its surrogate (``\\udcff``), as Python's ``json`` gives it back: the document
    stays UTF-8 (it carried the raw byte, which jq and strict decoders reject), and
    ``os.fsencode`` of the parsed name is the file's name, byte for byte."""
    import json
    import os
    import sys

    site = make_site_packages("n1", files={f"{SRT}/a.py": "a = 1\n"})
    write_config({"n1": local_node(site)})
    assert run_inproc("pull", "n1").code == 0
    name = os.fsencode(site / SRT) + b"/bad\xff \xc3\xa9.py"
    Path(os.fsdecode(name)).write_text("b = 1\n")
    for command in (["diff", "n1", "--json"], ["status", "n1", "--json"]):
        done = subprocess.run([sys.executable, "-m", "snapver", *command], capture_output=True, timeout=120)
        assert done.returncode == 1, done
        text = done.stdout.decode("utf-8")  # strict: raises on a raw \xff
        assert "\\udcff" in text and "é" in text  # only the undecodable byte is escaped
        found = json.dumps(json.loads(text))
        assert "bad\\udcff \\u00e9.py" in found, (command, text)
    changes = json.loads(subprocess.run([sys.executable, "-m", "snapver", "diff", "n1", "--json"],
                                        capture_output=True).stdout)["changes"]
    assert [os.fsencode(c["path"]) for c in changes] == [f"{SRT}/".encode() + b"bad\xff \xc3\xa9.py"]
