"""`snapver env`: the environment matrix, live, over real sshd nodes whose venvs the real pip
filled (different versions of a small real wheel), a stand-in nvidia-smi for the GPU
rows, local nodes for a wide fleet; and the outlier rule as a table."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from envkit import python_with_path, stand_in_smi, venv_node

from snapver.ops.env import outliers_of


def dist(site: Path, name: str, version: str) -> None:
    folder = site / f"{name}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\n")


@pytest.mark.parametrize(("values", "outliers"), [
    ({"a": "1", "b": "1", "c": "2"}, {"c"}),
    ({"a": "1", "b": "2"}, set()),  # no value has most
    ({"a": "1", "b": None, "c": "1"}, {"b"}),  # absent is a value too
    ({"a": "1", "b": "1"}, set()),
    ({"a": "1", "b": "2", "c": "3", "d": "1"}, {"b", "c"}),
])
def test_outliers_are_the_nodes_off_the_most_common_value(values: dict, outliers: set) -> None:
    assert outliers_of(values) == outliers


@pytest.fixture
def two_venvs(sshd, ssh_node, write_config, tmp_path: Path) -> Path:
    """ct200 with tinypkg 1.0.0, ct129 with 1.1.0 (both flash_stub 0.5.0), each with a
    stand-in nvidia-smi: the same GPUs, drivers 580.95.05 and 580.159."""
    nodes = {}
    for name, version, driver in (("ct200", "1.0.0", "580.95.05"), ("ct129", "1.1.0", "580.159")):
        python, site = venv_node(tmp_path / name, {"tinypkg": version, "flash_stub": "0.5.0"})
        wrapper = python_with_path(tmp_path / f"{name}-bin", python, tmp_path / f"{name}-fakebin")
        stand_in_smi(tmp_path / f"{name}-fakebin", driver=driver, gpus=8)
        nodes[name] = ssh_node(name, site, python=str(wrapper))
    write_config(nodes, where=tmp_path)
    return tmp_path


def rows_of(out: str) -> dict[str, list[str]]:
    """The matrix's rows by item (the summary line, last, left out)."""
    lines = out.splitlines()[:-1]
    return {line.split()[0]: line.split()[1:] for line in lines if line and not line.startswith(" ")}


def test_env_shows_what_differs_across_nodes(two_venvs: Path, run_snapver) -> None:
    done = run_snapver("env", cwd=two_venvs)
    assert done.code == 1, done.err
    rows = rows_of(done.out)
    assert rows["tinypkg"] == ["1.0.0", "1.1.0"]
    assert "flash-stub" not in rows and "Python" not in rows
    assert "GPU driver" in done.out and "580.95.05" in done.out and "580.159" in done.out
    assert "2 of " in done.out and "items differ across 2 nodes" in done.out
    assert all(len(line) <= 80 for line in done.out.splitlines())


def test_env_all_and_names_after_dashes(two_venvs: Path, run_snapver) -> None:
    every = run_snapver("env", "--all", cwd=two_venvs)
    assert every.code == 1
    rows = rows_of(every.out)
    assert rows["flash-stub"] == ["0.5.0", "0.5.0"], every.out
    assert rows["Python"] == [".".join(map(str, sys.version_info[:3]))] * 2
    named = run_snapver("env", "--", "flash*", "GPU", cwd=two_venvs)
    assert named.code == 0, named.out + named.err
    assert set(rows_of(named.out)) == {"flash-stub", "GPU"}
    document = json.loads(run_snapver("env", "--json", "--", "tinypkg", cwd=two_venvs).out)
    assert document["exit_code"] == 1
    assert document["rows"] == [{"item": "tinypkg", "values": {"ct200": "1.0.0", "ct129": "1.1.0"},
                                 "agrees": False, "outliers": []}]


def test_env_marks_the_outlier_and_says_an_unreachable_node(sshd, ssh_node, local_node, make_site_packages,
                                                            write_config, run_snapver, tmp_path: Path) -> None:
    nodes = {}
    for name, version in (("ct200", "2.9.1+cu128"), ("fleet00", "2.9.1+cu128"), ("fleet01", "2.9.0+cu128")):
        site = make_site_packages(name, files={"sglang/srt/a.py": "a = 1\n"})
        dist(site, "torch", version)
        nodes[name] = ssh_node(name, site) if name == "ct200" else local_node(site)
    nodes["ct129"] = {**ssh_node("ct129", "/nowhere"), "port": 1}  # nothing listens there
    write_config(nodes, where=tmp_path)
    done = run_snapver("env", cwd=tmp_path)
    assert done.code == 3, done.out + done.err
    line = next(line for line in done.out.splitlines() if line.startswith("torch"))
    assert line.split() == ["torch", "2.9.1+cu128", "2.9.1+cu128", "2.9.0+cu128*"]
    assert "ct129" in done.err and "not compared: ct129" in done.out


def test_a_wide_fleet_fits_80_columns_in_blocks(local_node, make_site_packages, write_config, run_snapver,
                                                tmp_path: Path) -> None:
    nodes = {}
    for number in range(12):
        name = f"fleet{number:02d}"
        site = make_site_packages(name, files={"sglang/srt/a.py": "a = 1\n"})
        dist(site, "flashinfer-jit-cache", "0.5.0+cu128torch2.9.averyverylongbuildtag" if number % 2 else "0.5.0")
        dist(site, "a-distribution-with-a-very-long-name-indeed", f"1.{number % 3}")
        nodes[name] = local_node(site)
    write_config(nodes, where=tmp_path)
    named = run_snapver("env", "--", "a-distribution*", cwd=tmp_path, env={"COLUMNS": "200"})
    assert named.code == 1
    lines = named.out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    headers = [line for line in lines if line.lstrip().startswith("fleet0")]
    assert len(headers) >= 2  # more than one block
    assert "a-distribution-with-a-very-long-name-indeed " in named.out  # whole, never cut
    # A name and a value too long for even one node's column beside it: a record per item.
    done = run_snapver("env", cwd=tmp_path, env={"COLUMNS": "200"})
    assert done.code == 1
    lines = done.out.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "\u2026" not in done.out
    assert any(line.startswith("  fleet01  0.5.0+cu128torch2.9.averyverylongbuildtag") for line in lines), done.out
    assert "a-distribution-with-a-very-long-name-indeed" in lines, done.out
