"""`snapver diff --env`: what changed under the tree between two snapshots, a snapshot and
a live node, or two nodes, across real pip installs, upgrades and uninstalls into a venv
on a real sshd node; and the one line a plain diff adds when the ground moved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from envkit import python_with_path, stand_in_smi, uninstall, upgrade, venv_node


@pytest.fixture
def upgraded(sshd, ssh_node, write_config, run_snapver, tmp_path: Path) -> tuple[Path, Path]:
    """ct200 pulled twice around a pip upgrade (tinypkg 1.0.0 → 1.1.0), a new distribution
    (newpkg 0.5.0), an uninstall (flash_stub) and a new GPU driver: (project, python)."""
    python, site = venv_node(tmp_path / "venv", {"tinypkg": "1.0.0", "flash_stub": "0.5.0"})
    wrapper = python_with_path(tmp_path / "bin", python, tmp_path / "fakebin")
    stand_in_smi(tmp_path / "fakebin", driver="580.95.05", gpus=8)
    write_config({"ct200": ssh_node("ct200", site, python=str(wrapper))}, where=tmp_path)
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0
    upgrade(python, "tinypkg", "1.1.0")
    upgrade(python, "newpkg", "0.5.0")
    uninstall(python, "flash_stub")
    stand_in_smi(tmp_path / "fakebin", driver="580.159", gpus=8)
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0
    return tmp_path, python


def test_diff_env_between_two_pulls_lists_what_pip_changed(upgraded, run_snapver) -> None:
    project, _ = upgraded
    done = run_snapver("diff", "ct200~1", "ct200@latest", "--env", cwd=project)
    assert done.code == 1, done.err
    assert done.out.splitlines() == ["GPU driver 580.95.05 \u2192 580.159", "- flash-stub 0.5.0",
                                     "+ newpkg 0.5.0", "tinypkg 1.0.0 \u2192 1.1.0"]
    document = json.loads(run_snapver("diff", "ct200~1", "ct200@latest", "--env", "--json", cwd=project).out)
    assert {"item": "tinypkg", "old": "1.0.0", "new": "1.1.0"} in document["changes"]


def test_diff_env_snapshot_against_live_and_the_same(upgraded, run_snapver) -> None:
    project, python = upgraded
    same = run_snapver("diff", "ct200", "--env", cwd=project)
    assert same.code == 0 and same.out == "", same.out + same.err
    upgrade(python, "tinypkg", "1.2.0")
    moved = run_snapver("diff", "ct200@latest", "ct200", "--env", cwd=project)
    assert moved.code == 1 and moved.out.splitlines() == ["tinypkg 1.1.0 \u2192 1.2.0"]


def test_plain_diff_says_the_ground_moved_in_one_line(upgraded, run_snapver) -> None:
    project, python = upgraded
    done = run_snapver("diff", "ct200~1", "ct200@latest", cwd=project)
    assert done.code == 0, done.err  # the same tree
    lines = [line for line in done.err.splitlines() if line.startswith("environment differs")]
    assert lines == ["environment differs: 3 distributions (snapver diff 'ct200~1' ct200@latest --env)"]
    upgrade(python, "tinypkg", "1.3.0")
    live = run_snapver("diff", "ct200", cwd=project)
    assert live.code == 0 and "environment differs: 1 distribution (snapver diff ct200 --env)" in live.err
    quiet = run_snapver("diff", "ct200@latest", "ct200@latest", cwd=project)
    assert "environment differs" not in quiet.err


def test_diff_env_of_a_snapshot_that_recorded_none_is_a_usage_error(local_node, make_site_packages, write_config,
                                                                   run_snapver, tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    write_config({"ct200": local_node(site, environment=False)}, where=tmp_path)
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0
    done = run_snapver("diff", "ct200@latest", "ct200", "--env", cwd=tmp_path)
    assert done.code == 2 and "recorded no environment" in done.err and "Traceback" not in done.err
