"""One path grammar: `show REF PATH` takes what `diff -- PATH` takes (file names, globs,
paths from a tracked path); `show NODE@live PATH` prints the live file; `show` alone is
the newest snapshot; a group works in `diff GROUP` and `log GROUP`. Real sshd nodes,
real git store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from snapver_inproc import run_inproc

SRT = "sglang/srt"
WORKER = f"{SRT}/speculative/dflash_worker.py"
FILES = {WORKER: "draft = 1\n", f"{SRT}/layers/utils.py": "", f"{SRT}/lora/utils.py": "",
         f"{SRT}/server_args.py": "port = 30000\n"}


@pytest.fixture
def fleet(make_site_packages, ssh_node, write_config) -> dict[str, Path]:
    """ct200, ct129 (group tp8) and fleet00 over SSH, pulled; then ct200's worker edited live."""
    sites = {name: make_site_packages(name, files=FILES) for name in ("ct200", "ct129", "fleet00")}
    write_config({name: ssh_node(name, site) for name, site in sites.items()}, groups={"tp8": ["ct200", "ct129"]})
    assert run_inproc("pull", "--all").code == 0
    (sites["ct129"] / WORKER).write_text("draft = 2\n")
    assert run_inproc("pull", "ct129").code == 0  # ct129's second snapshot: the newest of all
    (sites["ct200"] / WORKER).write_text("draft = 3  # live hot-fix\n")
    return sites


def test_show_takes_file_names_globs_and_tracked_relative_paths(fleet) -> None:
    for operand in ("dflash_worker.py", "speculative/dflash_worker.py", "*/dflash_*.py", WORKER):
        shown = run_inproc("show", "ct129", operand)
        assert (shown.code, shown.out) == (0, "draft = 2\n"), (operand, shown)
    several = run_inproc("show", "ct129", "utils.py")
    assert several.code == 2 and f"{SRT}/layers/utils.py" in several.err and f"{SRT}/lora/utils.py" in several.err
    missing = run_inproc("show", "ct129", "speculative/dflash_workr.py")
    assert missing.code == 2 and f"did you mean {WORKER}" in missing.err, missing


def test_show_node_at_live_prints_the_live_file(fleet) -> None:
    live = run_inproc("show", "ct200@live", "dflash_worker.py")
    assert (live.code, live.out) == (0, (fleet["ct200"] / WORKER).read_text()), live
    stored = run_inproc("show", "ct200", "dflash_worker.py")
    assert stored.out == "draft = 1\n"


def test_show_without_a_ref_is_the_newest_snapshot(fleet, run_snapver) -> None:
    newest = json.loads(run_inproc("log", "-n", "1", "--json").out)["snapshots"][0]
    assert newest["node"] == "ct129"
    shown = run_inproc("show", "--json")
    assert shown.code == 0, shown
    assert json.loads(shown.out)["id"] == newest["id"]


def test_diff_group_is_one_diff_per_node_against_its_newest_snapshot(fleet) -> None:
    result = run_inproc("diff", "--name-status", "tp8")
    assert result.code == 1, result
    assert result.out == f"ct200:\nM\t{WORKER}\n", result
    brief = run_inproc("diff", "--brief", "tp8")
    assert brief.out == f"Files ct200@latest/{WORKER} and ct200/{WORKER} differ\n", brief
    document = json.loads(run_inproc("diff", "--json", "tp8").out)
    assert [(n["node"], n["identical"]) for n in document["nodes"]] == [("ct200", False), ("ct129", True)]
    (fleet["ct200"] / WORKER).write_text("draft = 1\n")
    same = run_inproc("diff", "tp8")
    assert (same.code, same.out) == (0, ""), same


def test_log_group_lists_its_nodes_snapshots_only(fleet) -> None:
    document = json.loads(run_inproc("log", "tp8", "--json").out)
    assert sorted(s["node"] for s in document["snapshots"]) == ["ct129", "ct129", "ct200"]
    times = [s["time"] for s in document["snapshots"]]
    assert times == sorted(times, reverse=True)
    ranged = json.loads(run_inproc("log", "ct[129,200]", "--json").out)
    assert [s["id"] for s in ranged["snapshots"]] == [s["id"] for s in document["snapshots"]]


def test_show_live_streams_a_big_file_in_bounded_memory(fleet, tmp_path: Path) -> None:
    """A 96 MB live file printed by `show NODE@live` costs the client far less than its size."""
    big = fleet["ct200"] / SRT / "big.bin"
    with open(big, "wb") as handle:
        for index in range(96):
            handle.write(bytes([index]) * (1 << 20))

    def peak_kib(operand: str) -> int:
        probe = ("import resource, sys\n"
                 "from snapver.cli import main\n"
                 "try:\n"
                 f"    main(['show', 'ct200@live', {operand!r}])\n"
                 "finally:\n"
                 "    sys.stderr.write('RSS %d\\n' % resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)\n")
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
        with open(tmp_path / "out.bin", "wb") as sink:
            done = subprocess.run([sys.executable, "-c", probe], stdout=sink, stderr=subprocess.PIPE, env=env,
                                  timeout=120)
        assert done.returncode == 0, done.stderr
        return int(done.stderr.decode().rsplit("RSS ", 1)[1].split()[0])

    small = peak_kib("server_args.py")
    large = peak_kib("big.bin")
    assert (tmp_path / "out.bin").stat().st_size == big.stat().st_size
    assert large - small < 40 * 1024, (small, large)
