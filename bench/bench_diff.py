"""Benchmark: snapver diff against rsync dry runs, one file changed in the real sglang/srt tree.

    python3 bench/bench_diff.py [--runs N] [--keep]

One node (ct200) over a loopback sshd, built from the wheel, pulled once; then one
file is edited on the node. Interleaved, each round:

  snapver diff -q NODE                   newest snapshot vs live, content-exact (node hashes)
  snapver diff --name-status SNAP NODE   the same, naming the changed file
  rsync -anc --itemize-changes           content-exact rival (checksums both sides)
  rsync -an                              the quick rival (size and mtime only)

rsync compares against a local copy of the tree as it was before the edit (cp -a, so
times match). Every run's output is checked: each must find exactly the one file.
The bar: median `diff -q` at most 2.0x `rsync -anc`.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import BenchEnv, Case, bench_main, interleave, print_table, run  # noqa: E402

NODE = "ct200"
CHANGED = "sglang/srt/server_args.py"
BAR = 2.0


def bench(env: BenchEnv, runs: int) -> dict[str, float]:
    site_packages = env.build_node(NODE)
    tree = site_packages / "sglang" / "srt"
    project = env.work / "project"
    env.write_config(project, {NODE: env.node_table(NODE, site_packages)})
    env.snapver("pull", NODE, cwd=project)
    snapshot = env.snapver("show", "--json", NODE, cwd=project).stdout
    snapshot_id = __import__("json").loads(snapshot)["id"]
    copy = env.work / "rsync-copy" / "srt"
    copy.parent.mkdir()
    shutil.copytree(tree, copy, symlinks=True, copy_function=shutil.copy2)
    with open(site_packages / CHANGED, "ab") as handle:
        handle.write(b"# hot-fix made on the node\n")
    files = sum(1 for p in tree.rglob("*") if not p.is_dir())
    expected_name_status = f"M\t{CHANGED}\n".encode()
    rsync_target = env.remote(NODE, f"{tree}/")

    def snapver_quiet(_round: int) -> None:
        done = env.snapver("diff", "-q", NODE, cwd=project, check=False)
        if done.returncode != 1 or done.stdout:
            raise RuntimeError(f"snapver diff -q: exit {done.returncode}, {done.stdout!r} {done.stderr!r}")

    def snapver_name_status(_round: int) -> None:
        done = env.snapver("diff", "--name-status", snapshot_id, NODE, cwd=project, check=False)
        if done.returncode != 1 or done.stdout != expected_name_status:
            raise RuntimeError(f"snapver diff --name-status: exit {done.returncode}, {done.stdout!r} {done.stderr!r}")

    def rsync(flags: str) -> None:
        done = run(["rsync", flags, "--itemize-changes", "-e", env.ssh_e(), rsync_target, f"{copy}/"])
        changed = [line for line in done.stdout.decode().splitlines() if line.startswith(">f")]
        if [line.split(" ", 1)[1] for line in changed] != ["server_args.py"]:
            raise RuntimeError(f"rsync {flags} found {changed[:5]}")

    cases = [
        Case("snapver diff -q", run=snapver_quiet),
        Case("snapver diff --name-status", run=snapver_name_status),
        Case("rsync -anc -i", run=lambda _r: rsync("-anc")),
        Case("rsync -an -i", run=lambda _r: rsync("-an")),
    ]
    print(f"one file changed in {NODE}:{tree} ({files} files)", file=sys.stderr)
    timings = interleave(cases, runs)
    ratios = print_table(f"one-file-change diff, {runs} interleaved runs", timings, {
        "snapver diff -q": "rsync -anc -i", "snapver diff --name-status": "rsync -anc -i",
        "rsync -an -i": "rsync -anc -i"})
    print()
    name = "snapver diff -q / rsync -anc -i"
    verdict = "within" if ratios[name] <= BAR else "OVER"
    print(f"  {name}: {ratios[name]:.2f}x ({verdict} the {BAR:g}x bar)")
    return ratios


if __name__ == "__main__":
    sys.exit(bench_main(bench, __doc__, default_runs=7))
