"""An editable install in a git checkout, on a real sshd node: the tree is found by asking
the node's Python (no site_packages), and known-good is the checkout's HEAD.

The node's Python is a venv (``python`` in the config) whose site-packages holds only what
``pip install -e`` leaves: a ``.pth`` naming the checkout's ``python/`` and a dist-info
whose RECORD lists no source. Results are checked with git and hashlib, not snapver.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from editable import TAG, VERSION, build_checkout, head, install_editable

HOTFIX = "sglang/srt/utils/auth.py"


@pytest.fixture
def editable_node(ssh_node, sglang_site_template: Path, tmp_path: Path) -> dict:
    """``{"node": [nodes.ct200] table, "root": the checkout's python/, "marker": the file an import writes}``."""
    marker = tmp_path / "sglang-was-imported"
    root = build_checkout(sglang_site_template, tmp_path / "sgl-workspace", str(marker))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    purelib = subprocess.run([str(venv / "bin/python"), "-c",
                              "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()
    install_editable(Path(purelib), str(root))
    node = ssh_node("ct200", "unused", python=str(venv / "bin/python"))
    del node["site_packages"]
    return {"node": node, "root": root, "marker": marker}


def test_an_editable_checkout_is_found_and_held_against_its_head(editable_node, write_config, run_snapver) -> None:
    root, marker = editable_node["root"], editable_node["marker"]
    write_config({"ct200": editable_node["node"]})
    commit = head(root)

    result = run_snapver("nodes", "--check", "--json")
    assert result.code == 0, result
    (row,) = json.loads(result.out)["nodes"]
    assert row["site_packages"] == str(root), row
    assert row["dists"] == f"sglang {VERSION} (editable at {root}, git {TAG} {commit[:7]})", row
    assert row["install"]["how"] == "editable" and row["install"]["found_by"] == "find_spec", row

    assert run_snapver("pull", "ct200").code == 0
    result = run_snapver("status", "ct200", "--json")
    assert result.code == 0, result
    (node,) = json.loads(result.out)["nodes"]
    assert node["known_good"]["name"] == f"git {TAG} ({commit[:7]})" and node["known_good"]["files"] == [], node

    # A hot-fix by hand: not as HEAD, no known source.
    with open(root / HOTFIX, "a") as handle:
        handle.write("# hot-fix\n")
    result = run_snapver("status", "ct200", "--json")
    assert result.code == 1, result
    (node,) = json.loads(result.out)["nodes"]
    assert node["known_good"]["commit"] == commit, node
    assert [(f["path"], f["status"], f["label"]) for f in node["known_good"]["files"]] == [(HOTFIX, "M", "hot-fix")]
    result = run_snapver("status", "ct200")
    assert f"git {TAG} ({commit[:7]})" in result.out, result

    # Captured as a patch, the same file is that patch's.
    assert run_snapver("patch", "capture", "hot", "ct200", "--base", "ct200").code == 0
    result = run_snapver("status", "ct200", "--json")
    (node,) = json.loads(result.out)["nodes"]
    assert [(f["path"], f["label"], f["patches"]) for f in node["known_good"]["files"]] == [(HOTFIX, "patch", ["hot"])]

    result = run_snapver("verify", "ct200", "--json")
    assert result.code == 1, result
    (checked,) = json.loads(result.out)["nodes"]
    assert checked["modified"] == [HOTFIX] and checked["missing"] == checked["extra"] == [], checked
    committed = subprocess.run(["git", "-C", str(root), "ls-tree", "-r", "--name-only", "HEAD", "--", "sglang/srt"],
                               check=True, capture_output=True, text=True).stdout.split()
    assert checked["checked"] == len(committed) and checked["against"] == f"git {TAG} ({commit[:7]})", checked
    assert not marker.exists(), "finding the package imported it"


def test_a_python_that_cannot_find_the_package_is_one_line_naming_why(ssh_node, write_config, run_snapver,
                                                                       tmp_path: Path) -> None:
    venv = tmp_path / "empty-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    node = ssh_node("ct200", "unused")
    del node["site_packages"]
    write_config({"ct200": {**node, "python": str(venv / "bin/python")}, "ct129": {**node, "host": "127.0.0.129"}})
    result = run_snapver("status", "ct129")  # its python3 finds no sglang either: no guess is listed
    assert result.code == 3 and "Traceback" not in result.err, result
    assert "cannot find sglang (importlib.util.find_spec('sglang') is None)" in result.err, result
    assert "set site_packages (or python)" in result.err, result
    result = run_snapver("pull", "ct200")  # a python told: its own site-packages, as before
    assert result.code == 3 and "empty-venv/lib" in result.err and "no such file" in result.err, result
