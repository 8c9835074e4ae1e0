"""verify with two dist-infos of one distribution (issue 14, reproduction 4): the real pip
installs 0.5.23, then `--ignore-installed` 0.5.22 over it; files are checked against the
RECORD of the version Python imports, the other dist-info is a leftover reported with
the command that removes it, and only a real modification exits 1. Real sshd."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from wheelkit import build_wheel, make_venv, pip_install


def test_two_dist_infos_verify_against_the_importable_one(sshd, ssh_node, write_config, run_snapver,
                                                          tmp_path: Path) -> None:
    old = build_wheel(tmp_path / "wheels", "0.5.22", {"sglang/srt/a.py": "a = 1\n", "sglang/srt/c.py": "c = 1\n"})
    new = build_wheel(tmp_path / "wheels", "0.5.23", {"sglang/srt/a.py": "a = 2\n", "sglang/srt/c.py": "c = 1\n",
                                                       "sglang/srt/b.py": "b = 1\n"})
    python, site = make_venv(tmp_path / "venv")
    pip_install(python, new)
    pip_install(python, old, "--ignore-installed")
    assert sorted(p.name for p in site.glob("sglang-*.dist-info")) == ["sglang-0.5.22.dist-info",
                                                                      "sglang-0.5.23.dist-info"]
    importable = subprocess.run([str(python), "-c", "import sglang; print(sglang.__version__)"],
                                capture_output=True, text=True, check=True).stdout.strip()
    assert importable == "0.5.22"
    write_config({"ct200": ssh_node("ct200", site)}, where=tmp_path)

    clean = run_snapver("verify", "ct200", cwd=tmp_path)
    assert clean.code == 0, clean
    assert "M\t" not in clean.out and "A\t" not in clean.out
    assert "leftover sglang 0.5.23 (sglang-0.5.23.dist-info)" in clean.out
    remove = f"rm -rf {shlex.quote(str(site / 'sglang-0.5.23.dist-info'))}"
    assert remove in clean.out
    report = json.loads(run_snapver("verify", "ct200", "--json", cwd=tmp_path).out)["nodes"][0]
    assert report["dists"] == ["sglang 0.5.22"] and report["leftover_files"] == ["sglang/srt/b.py"]
    assert report["modified"] == [] and report["checked"] == 2

    (site / "sglang/srt/c.py").write_text("c = 99  # hot-fix\n")
    dirty = run_snapver("verify", "ct200", cwd=tmp_path)
    assert dirty.code == 1
    assert [line for line in dirty.out.splitlines() if "\t" in line] == ["M\tsglang/srt/c.py"]

    subprocess.run(remove, shell=True, check=True)  # the command it printed removes the leftover
    (site / "sglang/srt/c.py").write_text("c = 1\n")
    after = run_snapver("verify", "ct200", cwd=tmp_path)
    assert "leftover" not in after.out
