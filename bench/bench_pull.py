"""Benchmark: snapver pull vs rsync -a and scp -r on the real sglang/srt tree, over a loopback sshd.

    python3 bench/bench_pull.py [--runs N] [--keep]

Two interleaved series (not part of the test suite):
  first pull     snapver pull into a fresh store  vs  rsync -a / scp -r into a fresh folder
  unchanged      snapver pull with nothing changed  vs  an rsync -a re-run onto its copy
The bars: both median ratios against rsync -a at most 3x.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BenchEnv, Case, bench_main, interleave, print_table, print_verdicts, run  # noqa: E402

NODE = "ct200"
BAR = 3.0


def _reset(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def bench(env: BenchEnv, runs: int) -> dict[str, float]:
    # A pull of 84 MB starts a detached `git repack` afterwards (off the pull's path). Left on,
    # it would load the machine during the next timed runs and write into stores already deleted.
    os.environ["SNAPVER_AUTO_GC"] = "0"
    site_packages = env.build_node(NODE)
    tree = site_packages / "sglang" / "srt"
    project = env.work / "project"
    env.write_config(project, {NODE: env.node_table(NODE, site_packages)})
    store = project / "snapshots"
    rsync_copy = env.work / "rsync-copy"
    scp_copy = env.work / "scp-copy"
    rsync = ["rsync", "-a", "-e", env.ssh_e(), env.remote(NODE, f"{tree}/")]

    def snapver_pull(_round: int) -> None:
        document = json.loads(env.snapver("pull", "--json", NODE, cwd=project).stdout)
        if document["exit_code"] != 0:
            raise RuntimeError(f"snapver pull failed: {document}")

    first = [
        Case("snapver pull", setup=lambda _r: _reset(store), run=snapver_pull),
        Case("rsync -a", setup=lambda _r: _reset(rsync_copy), run=lambda _r: run([*rsync, f"{rsync_copy}/"])),
        Case("scp -r", setup=lambda _r: _reset(scp_copy),
             run=lambda _r: run(env.scp("-r", "-q", env.remote(NODE, tree), str(scp_copy)))),
    ]
    print(f"first pull of {NODE}:{tree} ({sum(1 for p in tree.rglob('*') if not p.is_dir())} files)",
          file=sys.stderr)
    first_times = interleave(first, runs)

    # The stores and copies left by the last round are the starting point of the re-runs.
    def unchanged_pull(_round: int) -> None:
        document = json.loads(env.snapver("pull", "--json", NODE, cwd=project).stdout)
        node = document["nodes"][0]
        if not node["unchanged_since"] or node["fetched_files"]:
            raise RuntimeError(f"the re-pull was not a no-op: {node}")

    again = [
        Case("snapver re-pull", run=unchanged_pull),
        Case("rsync -a re-run", run=lambda _r: run([*rsync, f"{rsync_copy}/"])),
    ]
    print("unchanged re-pull", file=sys.stderr)
    again_times = interleave(again, runs)

    ratios = print_table(f"first pull, {runs} interleaved runs (fresh store / folder each run)", first_times,
                         {"snapver pull": "rsync -a", "scp -r": "rsync -a"})
    ratios.update(print_table(f"unchanged re-pull, {runs} interleaved runs", again_times,
                              {"snapver re-pull": "rsync -a re-run"}))
    print()
    print_verdicts(ratios, ["snapver pull / rsync -a", "snapver re-pull / rsync -a re-run"], BAR)
    return ratios


if __name__ == "__main__":
    sys.exit(bench_main(bench, __doc__, default_runs=5))
