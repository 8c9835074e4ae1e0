"""status: a node whose distributions are not what most of its group has gets a note,
from the environment read in the listing's round trip; nodes in venvs the real pip filled."""

from __future__ import annotations

import json
from pathlib import Path

from envkit import venv_node


def test_the_group_outlier_is_noted(sshd, ssh_node, local_node, write_config, run_snapver, tmp_path: Path) -> None:
    nodes = {}
    for name, version in (("ct200", "1.1.0"), ("ct129", "1.0.0"), ("fleet00", "1.1.0"), ("fleet01", "1.1.0")):
        python, site = venv_node(tmp_path / name, {"tinypkg": version, "flash_stub": "0.5.0"})
        nodes[name] = (ssh_node(name, site, python=str(python)) if name.startswith("ct")
                       else local_node(site, python=str(python)))
    write_config(nodes, groups={"tp8": ["ct200", "ct129", "fleet00", "fleet01"]}, where=tmp_path)
    done = run_snapver("status", cwd=tmp_path)
    noted = [line for line in done.out.splitlines() if "differs from" in line]
    assert noted == ["ct129: tinypkg differs from 3 of 3 nodes in tp8 (1.0.0; the others 1.1.0)"], done.out
    document = json.loads(run_snapver("status", "--json", cwd=tmp_path).out)
    notes = {row["node"]: row["notes"] for row in document["nodes"]}
    assert notes["ct129"] == ["tinypkg differs from 3 of 3 nodes in tp8 (1.0.0; the others 1.1.0)"]
    assert notes["ct200"] == notes["fleet00"] == notes["fleet01"] == []


def test_two_nodes_have_no_majority_and_no_note(sshd, ssh_node, write_config, run_snapver, tmp_path: Path) -> None:
    nodes = {}
    for name, version in (("ct200", "1.1.0"), ("ct129", "1.0.0")):
        python, site = venv_node(tmp_path / name, {"tinypkg": version})
        nodes[name] = ssh_node(name, site, python=str(python))
    write_config(nodes, where=tmp_path)
    done = run_snapver("status", cwd=tmp_path)
    assert "differs from" not in done.out, done.out
