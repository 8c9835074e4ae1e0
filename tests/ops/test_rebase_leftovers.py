"""Rebase over a pip leftover (issue 14, reproduction 3): a patch adds local_hook.py, the
real pip upgrades the node 0.5.22 → 0.5.23 and leaves it behind (not in the new RECORD);
the rebase keeps it (`kept … in the new base only as a leftover`), and the rebased patch
pushed to a fresh 0.5.23 node creates it. A file the new release ships, identical, is
dropped. Real pip, real venvs, real sshd."""

from __future__ import annotations

import subprocess
from pathlib import Path

from wheelkit import build_wheel, make_venv, pip_install

HOOK = "sglang/srt/local_hook.py"
SHIPPED = "sglang/srt/b.py"


def test_rebase_keeps_an_added_file_the_new_base_has_only_as_a_leftover(sshd, ssh_node, write_config, run_snapver,
                                                                         tmp_path: Path) -> None:
    old = build_wheel(tmp_path / "wheels", "0.5.22", {"sglang/srt/a.py": "a = 1\n"})
    new = build_wheel(tmp_path / "wheels", "0.5.23", {"sglang/srt/a.py": "a = 2\n", SHIPPED: "b = 1\n"})
    python, site = make_venv(tmp_path / "ct200")
    pip_install(python, old)
    fresh_python, fresh = make_venv(tmp_path / "ct129")
    pip_install(fresh_python, new)
    write_config({"ct200": ssh_node("ct200", site), "ct129": ssh_node("ct129", fresh)}, where=tmp_path)
    run = lambda *a: run_snapver(*a, cwd=tmp_path)  # noqa: E731
    assert run("pull", "ct200").code == 0
    (tmp_path / "hook.diff").write_text(
        f"--- /dev/null\n+++ b/{HOOK}\n@@ -0,0 +1 @@\n+HOOKED = True\n"
        f"--- /dev/null\n+++ b/{SHIPPED}\n@@ -0,0 +1 @@\n+b = 1\n")
    assert run("patch", "import", "hook", "hook.diff", "--base", "ct200").code == 0
    assert run("push", "hook", "ct200", "--yes").code == 0
    pip_install(python, new, "--upgrade")  # pip removes what the old RECORD lists, nothing else
    assert (site / HOOK).read_text() == "HOOKED = True\n"
    assert "local_hook" not in (site / "sglang-0.5.23.dist-info" / "RECORD").read_text()
    assert run("pull", "ct200").code == 0

    rebased = run("patch", "rebase", "hook", "--onto", "ct200")
    assert rebased.code == 0, rebased
    lines = {line.split()[1].rstrip(":"): " ".join(line.split())
             for line in rebased.out.splitlines() if line.startswith("  ")}
    assert lines[HOOK] == f"kept {HOOK}: in the new base only as a leftover"
    assert lines[SHIPPED] == f"dropped {SHIPPED}: the new base already has it"

    exported = run("patch", "export", "hook").out
    assert f"+++ b/{HOOK}" in exported and SHIPPED not in exported
    check = subprocess.run(["git", "apply", "--check", "-"], input=exported.encode(), cwd=fresh, capture_output=True)
    assert check.returncode == 0, check.stderr  # the export adds it to a fresh 0.5.23 too

    pushed = run("push", "hook", "ct129", "--yes")
    assert pushed.code == 0, pushed
    assert (fresh / HOOK).read_text() == "HOOKED = True\n"
    assert "nothing to do" in run("push", "hook", "ct200", "--dry-run").out  # already there
