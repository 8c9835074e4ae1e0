"""Canary waves (snapver/ops/waves.py): how the targets split into waves, as a table, and
a canary rollout on four nodes as a user runs it. (Faults between waves — Ctrl-C in the
pause, a connection lost — are in tests/hardening/test_faults_waves.py.)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import tree_hashes

from snapver.config import NodeSpec, parse_waves
from snapver.ops.plan import NodePlan
from snapver.ops.waves import split_waves

NAMES = [f"fleet0{n}" for n in range(4)]


@pytest.mark.parametrize("targets, spec, sizes", [
    (4, "10%,100%", [1, 3]),  # 10% of 4 is 0.4: rounded up, a canary of one node
    (4, "1,100%", [1, 3]),
    (4, "25%,50%,100%", [1, 1, 2]),
    (3, "1,25%,100%", [1, 2]),  # 25% of 3 rounds up to 1: the same wave as "1", dropped
    (10, "10%,100%", [1, 9]),
    (16, "1,25%,100%", [1, 3, 12]),
    (1, "10%,100%", [1]),
    (4, "50%", [2, 2]),  # what the last size leaves out is a last wave
    (4, "1,2", [1, 1, 2]),
    (2, "5,100%", [2]),  # a count beyond the targets is all of them
])
def test_split_waves(targets: int, spec: str, sizes: list[int]) -> None:
    nodes = [NodePlan(NodeSpec(f"n{i}", "/x", local=True)) for i in range(targets)]
    waves = split_waves(nodes, parse_waves(spec))
    assert [len(wave) for wave in waves] == sizes
    assert [plan for wave in waves for plan in wave] == nodes  # every node once, in order


def records(store: Path, node: str) -> list[dict]:
    out = subprocess.run(["git", "--git-dir", str(store), "log", "--format=%B%x00", f"refs/heads/pushes/{node}"],
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line[len("snapver-meta: "):]) for body in out.split("\0")
            for line in body.splitlines() if line.startswith("snapver-meta: ")]


def test_a_ten_percent_canary_of_four_nodes_is_one_node(make_site_packages, local_node, write_config, run_snapver,
                                                         isolated_env) -> None:
    """`push --waves 10%,100%` to four nodes with a health check that fails everywhere: the
    canary (one node, 10% of 4 rounded up) fails and is rolled back; the other three are
    never written and get "cancelled" records."""
    sites = {name: make_site_packages(name, files={"sglang/srt/a.py": "a = 1\n"}) for name in NAMES}
    write_config({name: local_node(site) for name, site in sites.items()}, groups={"fleet": NAMES})
    assert run_snapver("pull", "fleet").code == 0
    Path("fix.diff").write_text("--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n")
    assert run_snapver("patch", "import", "fix", "fix.diff", "--base", "fleet00", "--nodes", "fleet").code == 0
    original = {name: tree_hashes(site) for name, site in sites.items()}

    result = run_snapver("push", "fix", "--yes", "--waves", "10%,100%", "--health", "exit 1", "--json")
    assert result.code == 3, result
    document = json.loads(result.out)
    assert (document["waves"], document["waves_finished"], document["stop_reason"]) == ([["fleet00"], NAMES[1:]], 0,
                                                                                         "failed"), document
    assert {name: tree_hashes(site) for name, site in sites.items()} == original
    store = isolated_env / "snapshots"
    assert records(store, "fleet00")[0]["state"] == "rolled-back"
    for name in NAMES[1:]:
        assert [(r["state"], r["written"]) for r in records(store, name)] == [("cancelled", 0)], name
