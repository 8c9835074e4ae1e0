"""`snapver diff --brief`: GNU `diff -q`'s lines, checked against GNU diff itself on the
same two trees; `-q` stays git's --quiet (nothing printed)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from snapver_inproc import run_inproc

SRT = "sglang/srt"
BASE = {f"{SRT}/a.py": "one\n", f"{SRT}/sub/b.py": "x = 1\n", f"{SRT}/sub/c.py": "c = 1\n",
        f"{SRT}/same.py": "same\n"}


def two_nodes(make_site_packages, ssh_node, write_config) -> tuple[Path, Path]:
    """ct200 and ct129 over the real sshd: one file changed, one only on each side."""
    changed = {**BASE, f"{SRT}/a.py": "ONE\n", f"{SRT}/sub/d.py": "new\n"}
    del changed[f"{SRT}/sub/c.py"]
    site_a = make_site_packages("ct200", files=BASE)
    site_b = make_site_packages("ct129", files=changed)
    write_config({"ct200": ssh_node("ct200", site_a), "ct129": ssh_node("ct129", site_b)})
    return site_a, site_b


def gnu_brief(site_a: Path, site_b: Path, where: Path) -> str:
    """What GNU `diff -rq ct200 ct129` prints on copies of the two trees named as the nodes."""
    for name, site in (("ct200", site_a), ("ct129", site_b)):
        shutil.copytree(site, where / name, symlinks=True)
    done = subprocess.run(["diff", "-rq", "ct200", "ct129"], cwd=where, capture_output=True, text=True)
    assert done.returncode == 1, done
    return done.stdout


def test_brief_prints_gnu_diff_q_lines_and_exits_1(make_site_packages, ssh_node, write_config,
                                                   tmp_path: Path) -> None:
    site_a, site_b = two_nodes(make_site_packages, ssh_node, write_config)
    result = run_inproc("diff", "--brief", "ct200", "ct129")
    assert result.code == 1, result
    gnu = tmp_path / "gnu"
    gnu.mkdir()
    assert result.out == gnu_brief(site_a, site_b, gnu)
    assert result.out.splitlines() == [f"Files ct200/{SRT}/a.py and ct129/{SRT}/a.py differ",
                                       f"Only in ct200/{SRT}/sub: c.py",
                                       f"Only in ct129/{SRT}/sub: d.py"]
    paths = run_inproc("diff", "--brief", "ct200", "ct129", "--", "sub")
    assert (paths.code, paths.out.count("\n")) == (1, 2), paths
    same = run_inproc("diff", "--brief", "ct200", "ct129", "--", "same.py")
    assert (same.code, same.out) == (0, ""), same


def test_brief_says_a_type_or_mode_change(make_site_packages, ssh_node, write_config) -> None:
    site_a = make_site_packages("ct200", files=BASE)
    site_b = make_site_packages("ct129", files=BASE)
    os.chmod(site_b / SRT / "same.py", 0o755)
    (site_b / SRT / "a.py").unlink()
    os.symlink("same.py", site_b / SRT / "a.py")
    write_config({"ct200": ssh_node("ct200", site_a), "ct129": ssh_node("ct129", site_b)})
    result = run_inproc("diff", "--brief", "ct200", "ct129")
    assert result.code == 1, result
    assert result.out.splitlines() == [
        f"File ct200/{SRT}/a.py is a regular file while file ct129/{SRT}/a.py is a symbolic link",
        f"Files ct200/{SRT}/same.py and ct129/{SRT}/same.py differ in mode (100644 -> 100755)"]


def test_quiet_prints_nothing_and_its_help_says_so(make_site_packages, ssh_node, write_config,
                                                   run_snapver) -> None:
    two_nodes(make_site_packages, ssh_node, write_config)
    quiet = run_inproc("diff", "-q", "ct200", "ct129")
    assert (quiet.code, quiet.out, quiet.err) == (1, "", "")
    both = run_inproc("diff", "-q", "--brief", "ct200", "ct129")
    assert both.code == 2 and "--brief" in both.err and "Traceback" not in both.err
    shown = run_snapver("diff", "--help", env={"COLUMNS": "80"})
    text = " ".join(shown.out.replace("│", " ").split())
    assert "git's --quiet" in text and "GNU diff -q" in text, shown.out
