"""Every snapshot records the environment under its tree (``.snapver/env``), over a real
sshd into venvs the real pip installed: read back with git here, never with snapver's code."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

from envkit import python_with_path, stand_in_smi, upgrade, venv_node

NODE_REF = "refs/heads/nodes/ct200"


def git(store: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True, check=True,
                          text=True).stdout


def recorded(store: Path, rev: str = NODE_REF) -> dict:
    return json.loads(git(store, "cat-file", "blob", f"{rev}:.snapver/env"))


def meta(store: Path, rev: str = NODE_REF) -> dict:
    line = next(line for line in git(store, "log", "-1", "--format=%B", rev).splitlines()
                if line.startswith("snapver-meta: "))
    return json.loads(line[len("snapver-meta: "):])


def versions(document: dict) -> dict[str, str]:
    return {row["name"]: row["version"] for row in document["dists"]}


def snapshots(store: Path) -> int:
    return int(git(store, "rev-list", "--count", NODE_REF))


def test_pull_records_the_environment_and_show_prints_it(sshd, ssh_node, write_config, run_snapver,
                                                        tmp_path: Path) -> None:
    python, site = venv_node(tmp_path / "venv", {"tinypkg": "1.0.0"})
    wrapper = python_with_path(tmp_path / "bin", python, tmp_path / "fakebin")
    stand_in_smi(tmp_path / "fakebin", driver="580.95.05", gpus=2)
    write_config({"ct200": ssh_node("ct200", site, python=str(wrapper))}, where=tmp_path)
    done = run_snapver("pull", "ct200", cwd=tmp_path)
    assert done.code == 0, done.err
    store = tmp_path / "snapshots"
    document = recorded(store)
    assert versions(document)["tinypkg"] == "1.0.0" and versions(document)["sglang"] == "0.5.0"
    assert document["python"]["version"] == ".".join(map(str, sys.version_info[:3]))
    blob = git(store, "rev-parse", f"{NODE_REF}:.snapver/env").strip()
    data = subprocess.run(["git", "--git-dir", str(store), "cat-file", "blob", blob], capture_output=True,
                          check=True).stdout
    assert meta(store)["env"] == blob == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    shown = run_snapver("show", "ct200", cwd=tmp_path)
    assert shown.code == 0, shown.err
    line = next(line for line in shown.out.splitlines() if line.startswith("environment:"))
    assert "2 \u00d7 NVIDIA H100 80GB HBM3" in line and "driver 580.95.05" in line and "distributions" in line
    as_json = json.loads(run_snapver("show", "ct200", "--json", cwd=tmp_path).out)
    assert versions(as_json["environment"])["tinypkg"] == "1.0.0"


def test_pip_upgrade_between_two_pulls_is_a_new_snapshot_of_the_same_tree(sshd, ssh_node, write_config,
                                                                         run_snapver, tmp_path: Path) -> None:
    python, site = venv_node(tmp_path / "venv", {"tinypkg": "1.0.0"})
    write_config({"ct200": ssh_node("ct200", site, python=str(python))}, where=tmp_path)
    store = tmp_path / "snapshots"
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0
    first_env = git(store, "rev-parse", f"{NODE_REF}:.snapver/env").strip()
    again = run_snapver("pull", "ct200", cwd=tmp_path)
    assert again.code == 0 and "unchanged since" in again.out and snapshots(store) == 1
    upgrade(python, "tinypkg", "1.1.0")
    moved = run_snapver("pull", "ct200", "--json", cwd=tmp_path)
    assert moved.code == 0, moved.err
    row = json.loads(moved.out)["nodes"][0]
    assert row["changed"] == 0 and row["env_changed"] is True and snapshots(store) == 2
    assert versions(recorded(store, f"{NODE_REF}~1"))["tinypkg"] == "1.0.0"
    assert versions(recorded(store))["tinypkg"] == "1.1.0"
    assert git(store, "rev-parse", f"{NODE_REF}^{{tree}}") != git(store, "rev-parse", f"{NODE_REF}~1^{{tree}}")
    assert git(store, "diff", "--name-only", f"{NODE_REF}~1", NODE_REF).split() == [".snapver/env"]
    # Unchanged again: no snapshot; the next tree change records the same environment blob.
    assert "unchanged since" in run_snapver("pull", "ct200", cwd=tmp_path).out and snapshots(store) == 2
    (site / "sglang" / "srt" / "a.py").write_text("a = 2\n")
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0 and snapshots(store) == 3
    assert git(store, "rev-parse", f"{NODE_REF}:.snapver/env") == git(store, "rev-parse", f"{NODE_REF}~1:.snapver/env")
    assert git(store, "rev-parse", f"{NODE_REF}:.snapver/env").strip() != first_env


def test_a_hanging_nvidia_smi_is_a_note_never_a_failed_pull(sshd, ssh_node, make_site_packages, write_config,
                                                           run_snapver, tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    wrapper = python_with_path(tmp_path / "bin", sys.executable, tmp_path / "fakebin")
    stand_in_smi(tmp_path / "fakebin", hang=True)
    write_config({"ct200": ssh_node("ct200", site, python=str(wrapper))}, where=tmp_path)
    done = run_snapver("pull", "ct200", cwd=tmp_path, timeout=60)
    assert done.code == 0, done.err
    assert any("nvidia-smi did not answer within 3 s" in note for note in recorded(tmp_path / "snapshots")["notes"])


def test_five_thousand_distributions_pull_with_a_bounded_record(local_node, make_site_packages, write_config,
                                                                run_snapver, tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    for number in range(5000):
        dist_info = site / f"pkg{number:04d}-1.{number}.dist-info"
        dist_info.mkdir()
        (dist_info / "METADATA").write_text(f"Name: pkg{number:04d}\nVersion: 1.{number}\n\n")
    write_config({"ct200": local_node(site)}, where=tmp_path)
    done = run_snapver("pull", "ct200", cwd=tmp_path)
    assert done.code == 0, done.err
    store = tmp_path / "snapshots"
    size = int(git(store, "cat-file", "-s", f"{NODE_REF}:.snapver/env"))
    document = recorded(store)
    assert len(document["dists"]) == 2000 and size < 2000 * 1000
    assert any("more distributions not read" in note for note in document["notes"])
    assert git(store, "ls-tree", "-r", "--name-only", NODE_REF).split().count("sglang/srt/a.py") == 1


def test_environment_false_records_none(local_node, make_site_packages, write_config, run_snapver,
                                        tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    write_config({"ct200": local_node(site, environment=False)}, where=tmp_path)
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0
    names = git(tmp_path / "snapshots", "ls-tree", "-r", "--name-only", NODE_REF).split()
    assert ".snapver/env" not in names and "env" not in meta(tmp_path / "snapshots")
    shown = run_snapver("show", "ct200", cwd=tmp_path)
    assert "environment:   not recorded" in shown.out


def test_an_unchanged_tree_whose_last_snapshot_recorded_no_environment_makes_no_snapshot(
        local_node, make_site_packages, write_config, run_snapver, tmp_path: Path) -> None:
    """A store whose snapshots predate environments (here: taken with ``environment =
    false``): turning it on makes no 0-file snapshot per node; the next real change records it."""
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n"})
    write_config({"ct200": local_node(site, environment=False)}, where=tmp_path)
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0
    write_config({"ct200": local_node(site)}, where=tmp_path)
    again = run_snapver("pull", "ct200", cwd=tmp_path)
    assert again.code == 0 and "unchanged since" in again.out, again
    assert snapshots(tmp_path / "snapshots") == 1
    (site / "sglang/srt/a.py").write_text("a = 2\n")
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0
    assert snapshots(tmp_path / "snapshots") == 2 and "env" in meta(tmp_path / "snapshots")


def test_an_unchanged_environment_is_not_read_again_and_an_upgrade_is(sshd, ssh_node, write_config, run_snapver,
                                                                       tmp_path: Path) -> None:
    """A re-pull sends the mark of the environment its last snapshot recorded: the node reads
    neither the distributions nor nvidia-smi again while nothing they come from changed; a pip
    upgrade changes the mark, and the new environment is read and recorded."""
    python, site = venv_node(tmp_path / "venv", {"tinypkg": "1.0.0"})
    wrapper = python_with_path(tmp_path / "bin", python, tmp_path / "fakebin")
    smi = stand_in_smi(tmp_path / "fakebin", driver="580.95.05", gpus=1)
    runs = tmp_path / "smi-runs"
    smi.write_text(smi.read_text().replace("#!/bin/sh\n", f'#!/bin/sh\necho run >> "{runs}"\n', 1))
    write_config({"ct200": ssh_node("ct200", site, python=str(wrapper))}, where=tmp_path)
    store = tmp_path / "snapshots"
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0
    assert runs.read_text().count("run") == 1
    for _ in range(2):  # the first re-pull may read it whole once (nothing remembered of it yet)
        again = run_snapver("pull", "ct200", cwd=tmp_path)
        assert again.code == 0 and "unchanged since" in again.out, again
    before = runs.read_text().count("run")
    again = run_snapver("pull", "ct200", cwd=tmp_path)
    assert "unchanged since" in again.out and runs.read_text().count("run") == before, again
    upgrade(python, "tinypkg", "1.1.0")
    moved = run_snapver("pull", "ct200", "--json", cwd=tmp_path)
    row = json.loads(moved.out)["nodes"][0]
    assert row["env_changed"] is True and snapshots(store) == 2, row
    assert versions(recorded(store))["tinypkg"] == "1.1.0"
    assert runs.read_text().count("run") == before + 1
