"""Serving groups and the failure budget (snapver/ops/units.py), as a user runs them: real
`snapver push` processes over real sshd nodes (fleet00..04), with a restart command that
appends a line to a log (the node, then what a.py holds on each node of the serving group
at that moment: the order of restarts and what each saw) and a health command that fails
on a node whose flag file exists. Nodes are checked with the test's own hashing, records
with git.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from helpers import tree_hashes

SRT = "sglang/srt"
FIX = f"--- a/{SRT}/a.py\n+++ b/{SRT}/a.py\n@@ -1 +1 @@\n-a = 1\n+a = 2\n"
GROUP = ("fleet01", "fleet00")  # config order: fleet01 restarts first, whatever the names' order


def records(store: Path, node: str) -> list[dict]:
    """A node's push records, newest first (their snapver-meta), read with git."""
    out = subprocess.run(["git", "--git-dir", str(store), "log", "--format=%B%x00", f"refs/heads/pushes/{node}"],
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line[len("snapver-meta: "):]) for body in out.split("\0")
            for line in body.splitlines() if line.startswith("snapver-meta: ")]


@pytest.fixture
def fleet(make_site_packages, ssh_node, write_config, run_snapver, tmp_path):
    """``fleet(count, serving=True)`` → the sites of fleet00.. (ssh), pulled, with patch ``fix``
    (a.py 1 → 2) for group ``all``; with ``serving``, fleet01 and fleet00 (in that order)
    are serving group dsv3. Restarts append to ``tmp_path/restarts.log``; a node fails its
    health check while ``tmp_path/fail-NODE`` exists."""

    def make(count: int, serving: bool = True) -> dict[str, Path]:
        names = [f"fleet{n:02d}" for n in range(count)]
        sites = {name: make_site_packages(name, files={f"{SRT}/a.py": "a = 1\n", f"{SRT}/b.py": "b = 1\n"})
                 for name in names}
        group_files = " ".join(f'"$(cat {sites[name] / SRT / "a.py"})"' for name in GROUP)
        log = tmp_path / "restarts.log"
        nodes = {name: ssh_node(name, site, restart=f"echo {name} {group_files} >> {log}",
                                health=f"test ! -e {tmp_path / ('fail-' + name)}") for name, site in sites.items()}
        groups: dict = {"all": names}
        if serving:
            groups["dsv3"] = {"nodes": list(GROUP), "serving": True}
        write_config(nodes, groups=groups)
        assert run_snapver("pull", "all").code == 0
        Path("fix.diff").write_text(FIX)
        assert run_snapver("patch", "import", "fix", "fix.diff", "--base", "fleet00", "--nodes", "all").code == 0
        return sites

    return make


def restarts(tmp_path: Path) -> list[str]:
    log = tmp_path / "restarts.log"
    return log.read_text().splitlines() if log.exists() else []


def test_a_serving_group_is_one_unit_of_a_wave_written_then_restarted_in_config_order(fleet, run_snapver,
                                                                                      tmp_path) -> None:
    """`push --waves 1,100%` to four nodes, two of them serving group dsv3: the plan shows
    units (wave 1 is the whole group); both nodes are written before either restarts, then
    restarted in config order; the other two follow in wave 2."""
    sites = fleet(4)
    shown = run_snapver("push", "fix", "--waves", "1,100%", "--dry-run")
    assert shown.code == 0, shown
    assert "wave 1: dsv3 (fleet01, fleet00)\nwave 2: fleet02, fleet03\n" in shown.out, shown
    assert "restarted in this order (fleet01, fleet00)" in shown.out, shown

    result = run_snapver("push", "fix", "--yes", "--waves", "1,100%")
    assert result.code == 0, result
    assert "wave 1: dsv3 (fleet01, fleet00)" in result.out and "all 2 wave(s) finished" in result.out, result
    lines = restarts(tmp_path)
    assert lines[:2] == ["fleet01 a = 2 a = 2", "fleet00 a = 2 a = 2"], lines
    assert sorted(line.split()[0] for line in lines[2:]) == ["fleet02", "fleet03"], lines
    assert all((site / SRT / "a.py").read_text() == "a = 2\n" for site in sites.values())


@pytest.mark.parametrize("max_fail", [None, "1"])
def test_a_serving_group_is_rolled_back_together_when_one_of_its_nodes_fails_health(fleet, run_snapver, tmp_path,
                                                                                    isolated_env, max_fail) -> None:
    """fleet00 (the group's second node) fails its health check: both nodes of dsv3 are
    rolled back and restarted on the restored code, in config order. Without a budget the
    push stops there (wave 2 never written); with `--max-fail 1` the group counts as one
    failed unit and wave 2 goes on. Exit 3 either way, the group named."""
    sites = fleet(4)
    original = {name: tree_hashes(site) for name, site in sites.items()}
    (tmp_path / "fail-fleet00").touch()
    result = run_snapver("push", "fix", "--yes", "--waves", "1,100%", *(["--max-fail", max_fail] if max_fail else []))
    assert result.code == 3, result
    assert "Traceback" not in result.err, result
    assert restarts(tmp_path)[:4] == ["fleet01 a = 2 a = 2", "fleet00 a = 2 a = 2",
                                      "fleet01 a = 1 a = 1", "fleet00 a = 1 a = 1"], restarts(tmp_path)
    assert "fleet01: rolled back with serving group dsv3 (fleet00 failed)" in result.err, result
    store = isolated_env / "snapshots"
    for name in GROUP:
        assert tree_hashes(sites[name]) == original[name], name
        assert records(store, name)[0]["state"] == "rolled-back", name
    for name in ("fleet02", "fleet03"):
        if max_fail is None:
            assert tree_hashes(sites[name]) == original[name], name
            assert records(store, name)[0]["state"] == "cancelled", name
        else:
            assert (sites[name] / SRT / "a.py").read_text() == "a = 2\n", name
            assert records(store, name)[0]["state"] == "done", name
    if max_fail is not None:
        assert "failed (1 unit(s), within the failure budget (1): the push went on): dsv3 (fleet01, fleet00)" \
            in result.err, result


def test_max_fail_lets_one_unit_fail_and_stops_at_the_second(fleet, run_snapver, tmp_path, isolated_env) -> None:
    """Five nodes, one per wave, `--max-fail 1`; fleet01 and fleet03 fail their health
    checks: fleet01 is rolled back and the push goes on; fleet03 is the failure beyond the
    budget: the push stops (fleet04 never written) and rolls back what it wrote (fleet00
    and fleet02, whose waves finished). Exit 3; both failed units named."""
    sites = fleet(5, serving=False)
    original = {name: tree_hashes(site) for name, site in sites.items()}
    for name in ("fleet01", "fleet03"):
        (tmp_path / f"fail-{name}").touch()
    result = run_snapver("push", "fix", "--yes", "--waves", "1,2,3,4,100%", "--max-fail", "1")
    assert result.code == 3, result
    assert "push stopped after 3 of 5 wave(s) finished; not written: fleet04" in result.err, result
    assert "failed (2 unit(s), more than the failure budget (1) allows: the push stopped): fleet01, fleet03" \
        in result.err, result
    store = isolated_env / "snapshots"
    assert {name: tree_hashes(site) for name, site in sites.items()} == original
    assert records(store, "fleet01")[0]["state"] == "rolled-back"
    assert records(store, "fleet03")[0]["state"] == "rolled-back"
    assert [r["state"] for r in records(store, "fleet04")] == ["cancelled"]
    for name in ("fleet00", "fleet02"):  # their waves finished: undone by a recorded rollback
        assert [(r["action"], r["state"]) for r in records(store, name)][:2] == [("rollback", "done"),
                                                                              ("rollback", "started")], name


def test_a_push_naming_part_of_a_serving_group_is_refused(fleet, run_snapver) -> None:
    """`push fix fleet00` where fleet00 runs one server with fleet01: exit 2 naming the group
    and the missing node, hint: name the group; nothing written, nothing recorded."""
    sites = fleet(2)
    original = {name: tree_hashes(site) for name, site in sites.items()}
    result = run_snapver("push", "fix", "fleet00", "--yes")
    assert result.code == 2, result
    lines = result.err.splitlines()
    assert lines[0] == ("snapver: error: the targets name only part of serving group 'dsv3': fleet01 missing "
                        "(its nodes fleet01, fleet00 run one server and are pushed together)"), result
    assert lines[1].startswith("hint: name the group: `snapver push fix dsv3`"), result
    assert {name: tree_hashes(site) for name, site in sites.items()} == original


@pytest.mark.parametrize("value, reason", [("150%", "is out of range"), ("-1", "is not a number of units"),
                                           ("abc", "is not a number of units")])
def test_a_bad_max_fail_is_refused_before_writing(fleet, run_snapver, value, reason) -> None:
    sites = fleet(2, serving=False)
    original = {name: tree_hashes(site) for name, site in sites.items()}
    result = run_snapver("push", "fix", "--yes", f"--max-fail={value}")
    assert result.code == 2, result
    assert result.err.startswith(f"snapver: error: --max-fail: {value!r} {reason}") and "Traceback" not in result.err
    assert {name: tree_hashes(site) for name, site in sites.items()} == original
