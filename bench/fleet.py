"""Benchmark: a fleet of 16 identical nodes, `snapver pull --all` vs 16 parallel `rsync -a`.

    python3 bench/fleet.py [--runs N] [--json] [--keep] [--baseline REV]
    python3 bench/fleet.py --status [--baseline REV] [--runs N]

With ``--status``: the fleet is pulled once (untimed), then `snapver status --json` of
all 16 nodes is timed (the RECORD comparison included), interleaved with the
same command run by the snapver of git revision REV (``git archive``, e.g. ``main``):
the ratio of the medians is the bar (<= 1.2x). One extra status runs first with
this tree's snapver (reported apart, once: it reads the 16 RECORDs and hashes the store's
blobs once) so that the timed ones find the store's caches as any later status does.

With ``--baseline REV`` alone: one node's pull and ``--all`` by REV's snapver run in the
same rounds too, and the report adds REV's client CPU ratio and this tree's ``--all``
against REV's (an A/B on one fleet, one machine state).

One sshd (one config, 16 ListenAddress lines: 127.0.0.10-25, OpenSSH's limit per
process) serves 16 nodes fleet00..fleet15, each a copy of the real sglang/srt tree
(the wheel unpacked once, then `cp -a`). Interleaved, each round, into fresh stores
and folders:

  snapver pull fleet00     one node (the reference)
  snapver pull --all       all 16 at once
  rsync -a (1 node)        one node
  rsync -a x16             16 rsync -a at once, one folder per node
  nodes hash only (1)      what a node does in a pull that hashes, alone: the node's python
  nodes hash only x16      hashes every file as the agent does (HASH_TREE: 1 MiB pieces, git
                           blob ids), started here; no SSH, no transfer, no store. x16: all at once

Reported: wall time (median), bytes on the wire and fetched bytes from snapver's
`--json` (wire_bytes: the agent protocol both ways, fetched_bytes: file content
received; summed over nodes), rsync's own `--stats` byte counts (protocol bytes, both
ways), peak client memory, the client's own CPU (user + sys of the command and the
children it waited for: resource.getrusage(RUSAGE_CHILDREN) around the run), and the
ratios: the fleet pull against one node's pull (the bars: client CPU <= 1.5x,
bytes <= 1.05x; the wall time is reported, no longer a bar: on this 2-core machine the
16 nodes share the client's cores), and against 16 rsyncs. Timed snapver runs
get SNAPVER_AUTO_GC=0. The nodes are processes on this machine: their hashing competes
with the client for its cores, which "nodes hash only x16" measures on its own.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    BenchEnv,
    Case,
    add_node_home_option,
    baseline_env,
    bench_env,
    interleave,
    machine_cpu_seconds,
    median,
    run_measured,
    run_measured_all,
)

FLEET = {f"fleet{index:02d}": f"127.0.0.{10 + index}" for index in range(16)}
ONE = "fleet00"
# The bars for the fleet pull against one node's: the client's own CPU (user + sys of
# the snapver process and the git it waits for) and the bytes. The old wall bar (<= 2x) is
# reported, no longer a bar: on 2 cores the 16 nodes' sshd and agents share the client's
# cores, so the wall time measures this machine, not what snapver controls.
CPU_BAR = 1.5
BYTES_BAR = 1.05
# What every node but the first does in a fleet's first pull, as the agent does it; prints
# the number of files hashed.
HASH_TREE = """import hashlib, os, sys
piece = memoryview(bytearray(1 << 20))
count = 0
for folder, _dirs, names in os.walk(sys.argv[1]):
    for name in names:
        path = os.path.join(folder, name)
        st = os.lstat(path)
        if os.path.islink(path):
            continue
        digest = hashlib.sha1(b"blob %d\\0" % st.st_size)
        fd = os.open(path, os.O_RDONLY)
        while True:
            got = os.readv(fd, [piece])
            if not got:
                break
            digest.update(piece[:got])
        os.close(fd)
        digest.hexdigest()
        count += 1
print(count)
"""


def build_fleet(env: BenchEnv) -> dict[str, Path]:
    """The wheel unpacked for the first node, copied (cp -a: same bytes, modes, times) for the others."""
    sites = {ONE: env.build_node(ONE)}
    for node in FLEET:
        if node != ONE:
            sites[node] = env.build_node(node, copy_of=sites[ONE])
    return sites


def _rsync_bytes(done: subprocess.CompletedProcess[bytes]) -> tuple[int, int]:
    """(files transferred, bytes sent + received) from rsync --stats."""
    text = done.stdout.decode()

    def number(label: str) -> int:
        found = re.search(rf"^{label}: ([\d,]+)", text, re.M)
        if not found:
            raise RuntimeError(f"rsync --stats without {label!r}:\n{text}")
        return int(found.group(1).replace(",", ""))

    return (number("Number of regular files transferred"),
            number("Total bytes sent") + number("Total bytes received"))


def children_cpu_seconds() -> float:
    """User + system CPU of this process's waited-for children so far (and theirs): the
    difference around one command is that command's own CPU, the git it ran included."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def bench(env: BenchEnv, runs: int, baseline: str | None = None) -> dict[str, Any]:
    sites = build_fleet(env)
    files = sum(1 for p in (sites[ONE] / "sglang" / "srt").rglob("*") if not p.is_dir())
    project = env.work / "project"
    env.write_config(project, {node: env.node_table(node, sites[node]) for node in FLEET})
    store = project / "snapshots"
    snapver_env = {**env.env(), "SNAPVER_AUTO_GC": "0"}
    copies = env.work / "copies"
    stats: dict[str, list[dict[str, Any]]] = {}

    def record(name: str, **figures: Any) -> None:
        stats.setdefault(name, []).append(figures)

    def snapver_pull(name: str, *targets: str, env_of: dict[str, str] = snapver_env) -> Case:
        def body(_round: int) -> None:
            cpu, client_cpu = machine_cpu_seconds(), children_cpu_seconds()
            done, peak = run_measured([*env.snapver_argv, "pull", "--json", *targets],
                                      cwd=project, env=env_of)
            cpu, client_cpu = machine_cpu_seconds() - cpu, children_cpu_seconds() - client_cpu
            nodes = json.loads(done.stdout)["nodes"]
            if len(nodes) != (len(FLEET) if "--all" in targets else 1) or not all(n["ok"] for n in nodes):
                raise RuntimeError(f"snapver pull {' '.join(targets)}: {nodes}")
            record(
                name,
                peak_kib=peak,
                machine_cpu_s=cpu,
                client_cpu_s=client_cpu,
                fetched_bytes=sum(n["fetched_bytes"] for n in nodes),
                wire_bytes=sum(n["wire_bytes"] for n in nodes),
                fetched_files=sum(n["fetched_files"] for n in nodes),
                nodes_sending_files=sum(1 for n in nodes if n["fetched_files"]),
                per_node=[
                    {k: n[k] for k in ("node", "fetched_files", "fetched_bytes", "wire_bytes", "seconds")}
                    for n in nodes
                ],
            )
        def setup(_round: int) -> None:
            shutil.rmtree(store, ignore_errors=True)
            settle()

        return Case(name, setup=setup, run=body)

    def rsync(name: str, nodes: list[str]) -> Case:
        commands = [["rsync", "-a", "--stats", "-e", env.ssh_e(),
                     env.remote(node, f"{sites[node]}/sglang/srt/"), f"{copies / node}/"] for node in nodes]

        def body(_round: int) -> None:
            cpu, client_cpu = machine_cpu_seconds(), children_cpu_seconds()
            done = run_measured_all(commands)
            cpu, client_cpu = machine_cpu_seconds() - cpu, children_cpu_seconds() - client_cpu
            transferred = [_rsync_bytes(d) for d, _peak in done]
            if any(count != files for count, _bytes in transferred):
                raise RuntimeError(f"{name}: files transferred {[c for c, _b in transferred]}, wanted {files}")
            record(name, peak_kib=sum(p for _d, p in done), machine_cpu_s=cpu, client_cpu_s=client_cpu,
                   wire_bytes=sum(b for _c, b in transferred))

        def setup(_round: int) -> None:
            shutil.rmtree(copies, ignore_errors=True)
            copies.mkdir()
            settle()

        return Case(name, setup=setup, run=body)

    def hash_only(name: str, nodes: list[str]) -> Case:
        # sites[node] is <venv>/lib/pythonX.Y/site-packages: the venv's own python.
        commands = [[str(sites[node].parents[2] / "bin" / "python3"), "-S", "-c", HASH_TREE,
                     str(sites[node] / "sglang" / "srt")] for node in nodes]

        def body(_round: int) -> None:
            cpu = machine_cpu_seconds()
            done = run_measured_all(commands)
            cpu = machine_cpu_seconds() - cpu
            counts = [int(d.stdout) for d, _peak in done]
            if any(count != files for count in counts):
                raise RuntimeError(f"{name}: files hashed {counts}, wanted {files}")
            record(name, peak_kib=max(p for _d, p in done), machine_cpu_s=cpu, wire_bytes=0)

        return Case(name, setup=lambda _round: settle(), run=body)

    cases = [snapver_pull("snapver pull fleet00", ONE), snapver_pull("snapver pull --all", "--all"),
             rsync("rsync -a (1 node)", [ONE]), rsync("rsync -a x16", list(FLEET)),
             hash_only("nodes hash only (1)", [ONE]), hash_only("nodes hash only x16", list(FLEET))]
    if baseline:  # the same two pulls by the snapver of REV, in the same rounds
        old_env = baseline_env(env, baseline, snapver_env)
        cases[2:2] = [snapver_pull(f"pull fleet00 ({baseline})", ONE, env_of=old_env),
                      snapver_pull(f"pull --all ({baseline})", "--all", env_of=old_env)]
    print(f"16 nodes x {files} files; {runs} interleaved runs (+1 warm-up)", file=sys.stderr)
    load_before = _uptime()
    timings = interleave(cases, runs)
    kept = {name: figures[1:] for name, figures in stats.items()}  # drop the warm-up round
    return {"files": files, "runs": runs, "timings": timings, "figures": kept, "baseline": baseline,
            "load_before": load_before, "load_after": _uptime()}


STATUS_BAR = 1.2


def bench_status(env: BenchEnv, runs: int, baseline: str | None) -> dict[str, Any]:
    """`snapver status --json` of 16 unchanged nodes, this tree against ``baseline``'s."""
    sites = build_fleet(env)
    project = env.work / "project"
    env.write_config(project, {node: env.node_table(node, sites[node]) for node in FLEET})
    snapver_env = {**env.env(), "SNAPVER_AUTO_GC": "0"}
    trees = {"snapver status x16": snapver_env}
    if baseline:
        trees[f"status x16 ({baseline})"] = baseline_env(env, baseline, snapver_env)
    done, _peak = run_measured([*env.snapver_argv, "pull", "--all", "--json"], cwd=project,
                               env=snapver_env)
    began = time.perf_counter()
    _done, cold_peak = run_measured([*env.snapver_argv, "status", "--json"], cwd=project,
                                    env=snapver_env)
    cold = {"seconds": round(time.perf_counter() - began, 3), "peak_kib": cold_peak}
    peaks: dict[str, list[int]] = {}

    def case(name: str, env_of: dict[str, str]) -> Case:
        def body(_round: int) -> None:
            done, peak = run_measured([*env.snapver_argv, "status", "--json"], cwd=project,
                                      env=env_of, check=False)
            nodes = json.loads(done.stdout)["nodes"]
            if done.returncode != 0 or len(nodes) != len(FLEET):
                raise RuntimeError(f"{name}: exit {done.returncode}: {done.stdout[:2000]!r}")
            peaks.setdefault(name, []).append(peak)

        return Case(name, run=body)

    timings = interleave([case(name, env_of) for name, env_of in trees.items()], runs)
    rows = {name: {"median_s": round(median(times), 3), "min_s": round(min(times), 3),
                   "max_s": round(max(times), 3), "peak_kib": max(peaks[name])} for name, times in timings.items()}
    summary: dict[str, Any] = {"runs": runs, "baseline": baseline, "rows": rows, "nproc": os.cpu_count(),
                               "first_status_after_the_pull": cold}
    if baseline:
        ratio = timings["snapver status x16"] and median(timings["snapver status x16"]) / median(
            timings[f"status x16 ({baseline})"])
        summary["ratio"] = round(ratio, 3)
        summary["bar"] = f"<= {STATUS_BAR:g}"
        summary["met"] = ratio <= STATUS_BAR
    return summary


def settle() -> None:
    """Untimed, before each run: write back what earlier runs left dirty (16 rsync copies:
    1.3 GB), so that the kernel's writeback does not compete with the next timed run."""
    os.sync()


def _uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    timings, figures = result["timings"], result["figures"]
    rows = []
    for name, times in timings.items():
        kept = figures[name]
        rows.append({"case": name, "runs": len(times), "median_s": round(median(times), 3),
                     "min_s": round(min(times), 3), "max_s": round(max(times), 3),
                     "wire_bytes": int(median([f["wire_bytes"] for f in kept])),
                     "fetched_bytes": int(median([f["fetched_bytes"] for f in kept])) if "fetched_bytes" in kept[0]
                     else None,
                     "nodes_sending_files": kept[-1].get("nodes_sending_files"),
                     "machine_cpu_s": round(median([f["machine_cpu_s"] for f in kept]), 2),
                     "client_cpu_s": round(median([f["client_cpu_s"] for f in kept]), 3) if "client_cpu_s" in kept[0]
                     else None,
                     "peak_kib": max(f["peak_kib"] for f in kept)})
    by = {row["case"]: row for row in rows}
    fleet, one = by["snapver pull --all"], by["snapver pull fleet00"]
    ratios = {
        "client CPU: snapver --all / snapver one node": fleet["client_cpu_s"] / one["client_cpu_s"],
        "wall: snapver --all / snapver one node": fleet["median_s"] / one["median_s"],
        "wire bytes: snapver --all / snapver one node": fleet["wire_bytes"] / one["wire_bytes"],
        "fetched bytes: snapver --all / snapver one node": fleet["fetched_bytes"] / one["fetched_bytes"],
        "wall: rsync x16 / rsync one node": by["rsync -a x16"]["median_s"] / by["rsync -a (1 node)"]["median_s"],
        "wall: snapver --all / rsync x16": fleet["median_s"] / by["rsync -a x16"]["median_s"],
        "wire bytes: snapver --all / rsync x16": fleet["wire_bytes"] / by["rsync -a x16"]["wire_bytes"],
        "wall: nodes hash only x16 / snapver one node": by["nodes hash only x16"]["median_s"] / one["median_s"],
    }
    if result.get("baseline"):
        rev = result["baseline"]
        old_fleet, old_one = by[f"pull --all ({rev})"], by[f"pull fleet00 ({rev})"]
        ratios[f"client CPU ({rev}): --all / one node"] = old_fleet["client_cpu_s"] / old_one["client_cpu_s"]
        ratios[f"client CPU: --all / --all ({rev})"] = fleet["client_cpu_s"] / old_fleet["client_cpu_s"]
    bars = [
        {"ratio": "client CPU: snapver --all / snapver one node", "bar": f"<= {CPU_BAR:g}"},
        {"ratio": "wire bytes: snapver --all / snapver one node", "bar": f"<= {BYTES_BAR:g}"},
        {"ratio": "fetched bytes: snapver --all / snapver one node", "bar": f"<= {BYTES_BAR:g}"},
    ]
    for bar in bars:
        bar["value"] = round(ratios[bar["ratio"]], 3)
        bar["met"] = bar["value"] <= float(bar["bar"].split()[1])
    per_node = figures["snapver pull --all"][-1]["per_node"]
    return {"files": result["files"], "runs": result["runs"], "rows": rows,
            "ratios": {k: round(v, 3) for k, v in ratios.items()}, "bars": bars,
            "last_fleet_pull_per_node": per_node,
            "load_before": result["load_before"], "load_after": result["load_after"], "nproc": os.cpu_count()}


def print_report(summary: dict[str, Any]) -> None:
    print(f"16-node fleet, sglang/srt ({summary['files']} files) on each; {summary['runs']} interleaved runs, medians; "
          f"node sessions' HOME: {summary['node_home']}")
    print(f"before: {summary['load_before']}\nafter:  {summary['load_after']}  ({summary['nproc']} cores)\n")
    header = f"  {'case':<22} {'runs':>4} {'median s':>9} {'min s':>7} {'max s':>7} {'wire MB':>9} " \
             f"{'fetched MB':>10} {'nodes sending files':>19} {'peak MiB':>8} {'machine CPU s':>13} " \
             f"{'client CPU s':>12}"
    print(header)
    for row in summary["rows"]:
        fetched = f"{row['fetched_bytes'] / 1e6:.2f}" if row["fetched_bytes"] is not None else "-"
        sending = row["nodes_sending_files"] if row["nodes_sending_files"] is not None else "-"
        print(f"  {row['case']:<22} {row['runs']:>4} {row['median_s']:>9.3f} {row['min_s']:>7.3f} "
              f"{row['max_s']:>7.3f} {row['wire_bytes'] / 1e6:>9.2f} {fetched:>10} {sending:>19} "
              f"{row['peak_kib'] / 1024:>8.0f} {row['machine_cpu_s']:>13.2f} "
              f"{row['client_cpu_s'] if row['client_cpu_s'] is not None else '-':>12}")
    # The nodes share this machine's cores with the client: a wall time near CPU / cores
    # means the run was bound by the CPU that all of them needed, not by waiting.
    print(f"  (machine CPU s: all processes, nodes included; on {summary['nproc']} cores a run takes at least "
          f"machine CPU / {summary['nproc']}; client CPU s: user + sys of the command and the children it "
          "waited for (snapver and its git; rsync and its ssh), nodes not included)")
    print("\nratios (medians):")
    for name, value in summary["ratios"].items():
        print(f"  {name:<48} {value:>7.2f}x")
    print("\nbars (client CPU and bytes; the wall ratio above is reported, not a bar on 2 cores):")
    for bar in summary["bars"]:
        print(f"  {bar['ratio']:<48} {bar['value']:>7.2f}x  bar {bar['bar']:<6} {'met' if bar['met'] else 'NOT MET'}")
    print("\nlast `snapver pull --all`, per node (files fetched, bytes fetched, wire bytes, seconds):")
    for node in summary["last_fleet_pull_per_node"]:
        print(f"  {node['node']}  {node['fetched_files']:>5}  {node['fetched_bytes']:>10}  {node['wire_bytes']:>10}"
              f"  {node['seconds']:>6.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="timed rounds (default 3)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--status", action="store_true", help="time `snapver status` of the fleet instead")
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also time the snapver of git REV (its pulls in the same rounds; with --status, its status)",
    )
    add_node_home_option(parser)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    started = time.time()
    with bench_env(keep=args.keep, addresses=FLEET, node_home=args.node_home,
                   client=args.client_python) as env:
        config = env.sshd.dir / "sshd_config.0"
        listens = sum(1 for line in config.read_text().splitlines() if line.startswith("ListenAddress "))
        print(f"one sshd, {config.name}: {listens} ListenAddress lines", file=sys.stderr)
        if args.status:
            status_summary = bench_status(env, args.runs, args.baseline)
            print(json.dumps(status_summary, indent=2))
            return 0
        summary = summarise(bench(env, args.runs, args.baseline))
    summary["seconds"] = round(time.time() - started, 1)
    summary["node_home"] = args.node_home
    if args.json:
        print(json.dumps({"command": " ".join(["python3", "bench/fleet.py", *sys.argv[1:]]), **summary}, indent=2))
    else:
        print_report(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
