"""The snapver benchmark suite: every scenario, over loopback and over 20 ms of RTT.

    python3 bench/suite.py [--runs N] [--slow-runs M] [--json] [--scenario NAME ...]
                           [--rtt-only | --loopback-only] [--keep] [--env-cost]

On the real sglang/srt tree (the wheel in ../shared/fixtures, unpacked as the test
fixture does) behind a loopback OpenSSH server, snapver against the tools it replaces:

  first-pull    snapver pull into a fresh store   vs rsync -a / scp -r into a fresh folder
  re-pull       snapver pull, nothing changed     vs an rsync -a re-run onto its copy
  change-pull   one file changed, snapver pull    vs rsync -a onto its copy
  diff          one file changed, snapver diff -q vs rsync -anc --itemize-changes against a copy,
                                                     and scp -r + diff -rq (the manual workflow)
  status        snapver status of 2 nodes (one drifted)
                                                  vs rsync -anc -i of both nodes at once,
                                                     and scp -r + diff -rq of both nodes at once
  push          snapver patch import + push --yes of a 2-file diff
                                                  vs rsync -a of the 2 files / scp of the 2 files
  container-pull, container-re-pull, container-diff
                the same pull / re-pull / diff -q on a local Docker container vs on the SSH
                node (and vs docker cp, docker cp + diff -rq): bench/container.py, loopback only

Each scenario runs on two networks: `loopback` (straight to sshd) and `rtt20` (through
bench/delay_proxy.py: 10 ms each way). Cases run interleaved (one run of each per
round, after one warm-up round), and every snapver scenario has a second snapver row,
`snapver (persistent)`, with `control_persist = 600` on the nodes; with --env-cost the
pulls and status have a third, `snapver (environment off)`: nodes with `environment = false`, so that
`snapver` / it is what recording the environment with each snapshot costs. scp-based cases over
rtt20 take minutes per run (a few round trips per file), so they run --slow-runs times
(default 1), after the interleaved rounds. Timed snapver runs get SNAPVER_AUTO_GC=0.

Every run's result is checked (the right files fetched, found or written), so a
figure is never the time of a failure. Peak memory is the largest resident set of
the command and the children it waited for (os.wait4), client side only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import container  # noqa: E402
from common import (  # noqa: E402
    REPO_ROOT,
    BenchEnv,
    Case,
    add_node_home_option,
    bench_env,
    interleave,
    median,
    run,
    run_measured,
    run_measured_all,
)
from helpers import toml_dumps  # noqa: E402

if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

SCENARIOS = ("first-pull", "re-pull", "change-pull", "diff", "status", "push", *container.SCENARIOS)
NODES = ("ct200", "ct129")
NODE = "ct200"
CHANGED = "sglang/srt/server_args.py"
PUSHED = ("sglang/srt/speculative/dflash_worker_v2.py",
          "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py")
PROXY_DELAY_MS = 10.0
PERSIST = "snapver (persistent)"
NOENV = "snapver (environment off)"  # --env-cost: nodes with environment = false

# The bars: (scenario, network, numerator, denominator, op, limit)
BARS = [
    ("first-pull", "loopback", "snapver", "rsync -a", "<=", 1.5),
    ("re-pull", "loopback", "snapver", "rsync -a", "<=", 2.0),
    ("diff", "loopback", "snapver", "rsync -anc -i", "<=", 2.0),
    ("first-pull", "rtt20", "snapver", "rsync -a", "<=", 1.0),
    ("re-pull", "loopback", "snapver", NOENV, "<=", 1.05),
    ("change-pull", "loopback", "snapver", NOENV, "<=", 1.05),
    ("first-pull", "loopback", "snapver", NOENV, "<=", 1.05),
    ("status", "loopback", "snapver", NOENV, "<=", 1.05),
    ("re-pull", "rtt20", "snapver", "rsync -a", "<=", 1.0),
    ("diff", "rtt20", "scp -r + diff -rq", "snapver", ">=", 50.0),
    *container.CONTAINER_BARS,
]


@dataclass
class Row:
    """One line of the table: a tool's timings in one scenario on one network."""

    scenario: str
    network: str
    tool: str
    times: list[float] = field(default_factory=list)
    peaks_kib: list[int] = field(default_factory=list)
    reference: str | None = None  # the row this one's median is divided by
    note: str = ""
    load: float = 0.0  # 1-minute load average when the scenario started

    def to_json(self, rows: Sequence[Row]) -> dict[str, Any]:
        return {"scenario": self.scenario, "network": self.network, "tool": self.tool,
                "runs": len(self.times), "times": [round(t, 4) for t in self.times],
                "median": _round(median(self.times)) if self.times else None,
                "min": _round(min(self.times)) if self.times else None,
                "max": _round(max(self.times)) if self.times else None,
                "peak_kib": max(self.peaks_kib) if self.peaks_kib else None,
                "ratio_to": self.reference, "ratio": _round(ratio(self, rows)), "note": self.note or None,
                "load1": round(self.load, 2)}


def _round(value: float | None) -> float | None:
    return None if value is None or value != value else round(value, 4)


def find_row(rows: Sequence[Row], scenario: str, network: str, tool: str) -> Row | None:
    return next((r for r in rows if (r.scenario, r.network, r.tool) == (scenario, network, tool)), None)


def ratio(row: Row, rows: Sequence[Row]) -> float | None:
    other = find_row(rows, row.scenario, row.network, row.reference) if row.reference else None
    if not row.times or other is None or not other.times:
        return None
    return median(row.times) / median(other.times)


@dataclass
class Network:
    """How the client reaches the nodes: straight to sshd, or through the delay proxy."""

    name: str
    endpoints: dict[str, tuple[str, int]]  # node -> (host, port) the client dials
    project: Path  # holds .snapver, persist.snapver and the store
    copies: Path  # the rivals' local copies

    @property
    def config(self) -> Path:
        return self.project / ".snapver"

    @property
    def persist_config(self) -> Path:
        return self.project / "persist.snapver"

    @property
    def noenv_config(self) -> Path:
        return self.project / "noenv.snapver"


class Suite:
    """The nodes, the networks and the commands every scenario uses."""

    def __init__(self, env: BenchEnv, runs: int, slow_runs: int, env_cost: bool = False) -> None:
        self.env = env
        self.env_cost = env_cost  # pulls also timed with environment = false (what recording it costs)
        self.runs = runs
        self.slow_runs = slow_runs
        self.sites: dict[str, Path] = {}
        self.networks: dict[str, Network] = {}
        self.proxy: subprocess.Popen[bytes] | None = None
        self.rows: list[Row] = []
        self.unavailable: list[str] = []
        self.changes = 0

    # -- set-up -----------------------------------------------------------------------
    def build(self, network_names: Sequence[str]) -> None:
        for node in NODES:
            self.sites[node] = self.env.build_node(node)
        for name in network_names:
            if name == "loopback":
                endpoints = {n: (self.env.sshd.addresses[n], self.env.sshd.port) for n in NODES}
            else:
                endpoints = self.start_proxy()
            network = Network(name, endpoints, self.env.work / name / "project", self.env.work / name / "copies")
            network.copies.mkdir(parents=True)
            for config, extra in ((network.config, {}), (network.persist_config, {"control_persist": 600}),
                                  (network.noenv_config, {"environment": False})):
                nodes = {n: {**self.env.node_table(n, self.sites[n], **extra),
                             "host": endpoints[n][0], "port": endpoints[n][1]} for n in NODES}
                config.parent.mkdir(parents=True, exist_ok=True)
                config.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": nodes}), encoding="utf-8")
            self.networks[name] = network

    def start_proxy(self) -> dict[str, tuple[str, int]]:
        """bench/delay_proxy.py in front of each node's sshd address; known_hosts learns the proxy ports."""
        mappings = [f"127.0.0.1:0={self.env.sshd.addresses[n]}:{self.env.sshd.port}" for n in NODES]
        self.proxy = subprocess.Popen(
            [sys.executable, str(Path(__file__).with_name("delay_proxy.py")), "--delay-ms", str(PROXY_DELAY_MS),
             "--parent", str(os.getpid()), *mappings], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
        assert self.proxy.stdout is not None
        line = self.proxy.stdout.readline().decode().split()
        if not line or line[0] != "ready":
            raise SystemExit("the delay proxy did not start")
        ports = [int(p) for p in line[1:]]
        with open(self.env.sshd.known_hosts, "a") as known:
            for port in ports:
                known.write(f"[127.0.0.1]:{port} {self.env.sshd.host_public_key}\n")
        return {n: ("127.0.0.1", port) for n, port in zip(NODES, ports, strict=False)}

    def close(self) -> None:
        self.stop_muxes()
        if self.proxy is not None and self.proxy.poll() is None:
            self.proxy.terminate()
            self.proxy.wait(10)

    def stop_muxes(self) -> None:
        """End the persistent-connection processes our persist.snapver configs started (by their socket)."""
        from snapver.config import load_config
        from snapver.transport.mux import spec_socket_path

        ours = {str(spec_socket_path(spec)) for network in self.networks.values()
                for spec in load_config(str(network.persist_config)).nodes.values()}
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            except OSError:
                continue
            if "snapver.transport.mux" in argv and any(arg in ours for arg in argv):
                try:
                    os.kill(int(proc.name), signal.SIGTERM)
                    print(f"stopped persistent connection process {proc.name}", file=sys.stderr)
                except ProcessLookupError:
                    pass
        for path in ours:
            Path(path).unlink(missing_ok=True)

    # -- commands -----------------------------------------------------------------------
    def snapver(self, network: Network, *args: str, persistent: bool = False, noenv: bool = False,
                codes: Sequence[int] = (0,)) -> tuple[subprocess.CompletedProcess[bytes], int]:
        config = network.persist_config if persistent else network.noenv_config if noenv else network.config
        env = {**self.env.env(), "SNAPVER_AUTO_GC": "0"}
        done, peak = run_measured([*self.env.snapver_argv, "--config", str(config), *args],
                                  check=False, cwd=network.project, env=env)
        if done.returncode not in codes:
            raise RuntimeError(f"snapver {' '.join(args)} exited {done.returncode}:\n"
                               f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}")
        return done, peak

    def ssh_options(self, network: Network, node: str, port_flag: str = "-p") -> list[str]:
        options = self.env.ssh_options(port_flag)
        options[options.index(port_flag) + 1] = str(network.endpoints[node][1])
        return options

    def remote(self, network: Network, node: str, path: Path | str) -> str:
        return f"root@{network.endpoints[node][0]}:{path}"

    def rsync(self, network: Network, node: str, *args: str) -> list[str]:
        return ["rsync", *args, "-e", " ".join(["ssh", *self.ssh_options(network, node)])]

    def scp(self, network: Network, node: str, *args: str) -> list[str]:
        return ["scp", *self.ssh_options(network, node, "-P"), *args]

    def tree(self, node: str) -> Path:
        return self.sites[node] / "sglang" / "srt"

    def sync_copy(self, node: str, copy: Path) -> None:
        """Make ``copy`` equal the node's tree now (local rsync, times kept), untimed."""
        copy.mkdir(parents=True, exist_ok=True)
        run(["rsync", "-a", "--delete", f"{self.tree(node)}/", f"{copy}/"])

    def change_file(self, node: str = NODE) -> None:
        """Append a new line to CHANGED on the node: one file differs from every earlier copy."""
        self.changes += 1
        with open(self.sites[node] / CHANGED, "ab") as handle:
            handle.write(f"# benchmark hot-fix {self.changes}\n".encode())

    def snapshot_now(self, network: Network, *nodes: str) -> None:
        """Untimed: make the newest snapshot of ``nodes`` equal their live trees."""
        self.snapver(network, "pull", *nodes)

    # -- timing -------------------------------------------------------------------------
    def measure(self, scenario: str, network: Network, cases: Sequence[tuple[str, Callable[[int], int],
                Callable[[int], Any] | None, bool]], references: dict[str, str]) -> None:
        """Time ``(tool, run -> peak KiB, setup, slow)`` cases interleaved; slow ones over rtt20 run apart."""
        load = os.getloadavg()[0]
        rows = {tool: Row(scenario, network.name, tool, reference=references.get(tool), load=load)
                for tool, *_ in cases}
        peaks: dict[str, list[int]] = {tool: [] for tool, *_ in cases}

        def timed(tool: str, body: Callable[[int], int]) -> Callable[[int], None]:
            return lambda round_index: peaks[tool].append(body(round_index))

        apart = network.name != "loopback"
        normal = [Case(tool, timed(tool, body), setup) for tool, body, setup, slow in cases if not (slow and apart)]
        slow = [Case(tool, timed(tool, body), setup) for tool, body, setup, slow in cases if slow and apart]
        print(f"[{scenario} / {network.name}] load {load:.2f}", file=sys.stderr, flush=True)
        for group, runs, warmup in ((normal, self.runs, 1), (slow, self.slow_runs, 0)):
            if group and runs <= 0:
                for case in group:
                    rows[case.name].note = "skipped (--slow-runs 0)"
            if not group or runs <= 0:
                continue
            for tool, times in interleave(group, runs, warmup=warmup).items():
                rows[tool].times = times
                rows[tool].peaks_kib = peaks[tool][warmup:]
                if group is slow:
                    rows[tool].note = f"{runs} run(s) after the others: minutes per run over rtt20"
        self.rows.extend(rows.values())


# -- checks --------------------------------------------------------------------------------
def _pull_document(done: subprocess.CompletedProcess[bytes]) -> list[dict[str, Any]]:
    document = json.loads(done.stdout)
    if document["exit_code"] != 0:
        raise RuntimeError(f"snapver pull failed: {document}")
    return document["nodes"]


def _itemized(done: subprocess.CompletedProcess[bytes]) -> list[str]:
    """The files an rsync --itemize-changes run sent or would send."""
    return [line.split(" ", 1)[1] for line in done.stdout.decode().splitlines() if line.startswith((">f", "<f"))]


def _expect(what: str, got: Any, wanted: Any) -> None:
    if got != wanted:
        raise RuntimeError(f"{what}: got {got!r}, wanted {wanted!r}")


# -- scenarios ------------------------------------------------------------------------------
def first_pull(suite: Suite, net: Network) -> None:
    store = net.project / "snapshots"
    rsync_copy, scp_copy = net.copies / "first-rsync", net.copies / "first-scp"
    files = sum(1 for p in suite.tree(NODE).rglob("*") if not p.is_dir())

    def pull(persistent: bool, noenv: bool = False) -> Callable[[int], int]:
        def body(_round: int) -> int:
            done, peak = suite.snapver(net, "pull", "--json", NODE, persistent=persistent, noenv=noenv)
            _expect("first pull fetched", _pull_document(done)[0]["fetched_files"], files)
            return peak
        return body

    def rsync(_round: int) -> int:
        return run_measured(suite.rsync(net, NODE, "-a", suite.remote(net, NODE, f"{suite.tree(NODE)}/"),
                                        f"{rsync_copy}/"))[1]

    def scp(_round: int) -> int:
        peak = run_measured(suite.scp(net, NODE, "-r", "-q", suite.remote(net, NODE, suite.tree(NODE)),
                                      str(scp_copy)))[1]
        _expect("scp -r copied", sum(1 for p in scp_copy.rglob("*") if not p.is_dir()), files)
        return peak

    def fresh(path: Path) -> Callable[[int], None]:
        return lambda _round: shutil.rmtree(path, ignore_errors=True)

    suite.measure("first-pull", net, [
        ("snapver", pull(False), fresh(store), False),
        (PERSIST, pull(True), fresh(store), False),
        *([(NOENV, pull(False, noenv=True), fresh(store), False)] if suite.env_cost else []),
        ("rsync -a", rsync, fresh(rsync_copy), False),
        ("scp -r", scp, fresh(scp_copy), True),
    ], {"snapver": "rsync -a", PERSIST: "rsync -a", "scp -r": "snapver", NOENV: "snapver"})


def _repull(suite: Suite, net: Network, scenario: str, changed: bool) -> None:
    copy = net.copies / "rsync"
    suite.snapshot_now(net, NODE)
    suite.sync_copy(NODE, copy)
    change = (lambda _round: suite.change_file()) if changed else None

    def pull(persistent: bool, noenv: bool = False) -> Callable[[int], int]:
        def body(_round: int) -> int:
            done, peak = suite.snapver(net, "pull", "--json", NODE, persistent=persistent, noenv=noenv)
            node = _pull_document(done)[0]
            if changed:
                _expect("changed pull fetched", (node["fetched_files"], bool(node["snapshot"])), (1, True))
            else:
                _expect("re-pull fetched", (node["fetched_files"], bool(node["unchanged_since"])), (0, True))
            return peak
        return body

    def rsync(_round: int) -> int:
        done, peak = run_measured(suite.rsync(net, NODE, "-a", "--itemize-changes",
                                              suite.remote(net, NODE, f"{suite.tree(NODE)}/"), f"{copy}/"))
        _expect("rsync -a sent", _itemized(done), ["server_args.py"] if changed else [])
        return peak

    suite.measure(scenario, net, [
        ("snapver", pull(False), change, False),
        (PERSIST, pull(True), change, False),
        *([(NOENV, pull(False, noenv=True), change, False)] if suite.env_cost else []),
        ("rsync -a", rsync, change, False),
    ], {"snapver": "rsync -a", PERSIST: "rsync -a", NOENV: "snapver"})


def re_pull(suite: Suite, net: Network) -> None:
    _repull(suite, net, "re-pull", changed=False)


def change_pull(suite: Suite, net: Network) -> None:
    _repull(suite, net, "change-pull", changed=True)


def _manual_diff(suite: Suite, net: Network, nodes: Sequence[str], copies: dict[str, Path],
                 fetched: dict[str, Path]) -> tuple[int, dict[str, list[str]]]:
    """scp -r each node's tree (all at once) into a fresh folder, then diff -rq against the copies."""
    scps = [suite.scp(net, n, "-r", "-q", suite.remote(net, n, suite.tree(n)), str(fetched[n])) for n in nodes]
    peak = sum(p for _done, p in run_measured_all(scps))
    diffs = run_measured_all([["diff", "-rq", str(copies[n]), str(fetched[n])] for n in nodes], check=False)
    found = {}
    for node, (done, diff_peak) in zip(nodes, diffs, strict=False):
        if done.returncode not in (0, 1):
            raise RuntimeError(f"diff -rq failed: {done.stderr.decode(errors='replace')}")
        found[node] = [line.split()[1].rsplit("/", 1)[-1] for line in done.stdout.decode().splitlines()]
        peak = max(peak, diff_peak)
    return peak, found


def diff(suite: Suite, net: Network) -> None:
    copy, fetched = net.copies / "rsync", net.copies / "scp-diff"
    suite.snapshot_now(net, NODE)
    suite.sync_copy(NODE, copy)
    suite.change_file()

    def snapver_diff(persistent: bool) -> Callable[[int], int]:
        def body(_round: int) -> int:
            done, peak = suite.snapver(net, "diff", "-q", NODE, persistent=persistent, codes=(1,))
            _expect("snapver diff -q printed", done.stdout, b"")
            return peak
        return body

    def rsync(_round: int) -> int:
        done, peak = run_measured(suite.rsync(net, NODE, "-anc", "--itemize-changes",
                                              suite.remote(net, NODE, f"{suite.tree(NODE)}/"), f"{copy}/"))
        _expect("rsync -anc -i found", _itemized(done), ["server_args.py"])
        return peak

    def manual(_round: int) -> int:
        peak, found = _manual_diff(suite, net, [NODE], {NODE: copy}, {NODE: fetched})
        _expect("scp -r + diff -rq found", found[NODE], ["server_args.py"])
        return peak

    suite.measure("diff", net, [
        ("snapver", snapver_diff(False), None, False),
        (PERSIST, snapver_diff(True), None, False),
        ("rsync -anc -i", rsync, None, False),
        ("scp -r + diff -rq", manual, lambda _round: shutil.rmtree(fetched, ignore_errors=True), True),
    ], {"snapver": "rsync -anc -i", PERSIST: "rsync -anc -i", "scp -r + diff -rq": "snapver"})


def status(suite: Suite, net: Network) -> None:
    copies = {n: net.copies / f"status-{n}" for n in NODES}
    fetched = {n: net.copies / f"status-scp-{n}" for n in NODES}
    suite.snapshot_now(net, *NODES)
    for node in NODES:
        suite.sync_copy(node, copies[node])
    suite.change_file(NODE)
    wanted = {NODE: ["server_args.py"], **{n: [] for n in NODES if n != NODE}}

    def snapver_status(persistent: bool, noenv: bool = False) -> Callable[[int], int]:
        def body(_round: int) -> int:
            done, peak = suite.snapver(net, "status", "--json", persistent=persistent, noenv=noenv, codes=(1,))
            rows = json.loads(done.stdout)["nodes"]
            _expect("snapver status drift", {r["node"]: [d["path"].rsplit("/", 1)[-1] for d in r["drift"] or []]
                                             for r in rows}, wanted)
            return peak
        return body

    def rsync(_round: int) -> int:
        done = run_measured_all([suite.rsync(net, n, "-anc", "--itemize-changes",
                                             suite.remote(net, n, f"{suite.tree(n)}/"), f"{copies[n]}/")
                                 for n in NODES])
        _expect("rsync -anc -i x2 found", {n: _itemized(d) for n, (d, _p) in zip(NODES, done, strict=False)}, wanted)
        return sum(p for _d, p in done)

    def manual(_round: int) -> int:
        peak, found = _manual_diff(suite, net, NODES, copies, fetched)
        _expect("scp -r + diff -rq x2 found", found, wanted)
        return peak

    def fresh(_round: int) -> None:
        for path in fetched.values():
            shutil.rmtree(path, ignore_errors=True)

    suite.measure("status", net, [
        ("snapver", snapver_status(False), None, False),
        (PERSIST, snapver_status(True), None, False),
        *([(NOENV, snapver_status(False, noenv=True), None, False)] if suite.env_cost else []),
        ("rsync -anc -i x2", rsync, None, False),
        ("scp -r + diff -rq x2", manual, fresh, True),
    ], {"snapver": "rsync -anc -i x2", PERSIST: "rsync -anc -i x2", "scp -r + diff -rq x2": "snapver",
        NOENV: "snapver"})


def push(suite: Suite, net: Network) -> None:
    site = suite.sites[NODE]
    work = net.copies / "push"
    original, patched = work / "a", work / "b"
    shutil.rmtree(work, ignore_errors=True)
    suite.snapshot_now(net, NODE)
    base = json.loads(suite.snapver(net, "show", "--json", NODE)[0].stdout)["id"]
    for path in PUSHED:
        for side in (original, patched):
            (side / path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(site / path, side / path)
        with open(patched / path, "ab") as handle:
            handle.write(b"# benchmark hot-fix pushed to the node\n")
    patch_file = work / "fix.diff"
    patch_file.write_bytes(subprocess.run(["diff", "-ru", "a", "b"], cwd=work, capture_output=True).stdout)
    state = {"dirty": ""}
    names = iter(range(1, 1 << 30))

    def restore(_round: int = 0) -> None:
        """Put the 2 files back as they were: rollback after snapver, a copy after the rivals."""
        if state["dirty"] == "snapver":
            suite.snapver(net, "rollback", NODE, "--yes")
        elif state["dirty"]:
            for path in PUSHED:
                shutil.copy2(original / path, site / path)
        state["dirty"] = ""
        for path in PUSHED:
            _expect(f"{path} restored", (site / path).read_bytes(), (original / path).read_bytes())

    def check_pushed() -> None:
        for path in PUSHED:
            _expect(f"{path} pushed", (site / path).read_bytes(), (patched / path).read_bytes())

    def snapver_push(persistent: bool) -> Callable[[int], int]:
        def body(_round: int) -> int:
            name = f"bench-{net.name}-{next(names)}"
            state["dirty"] = "snapver"
            _done, peak = suite.snapver(net, "patch", "import", name, str(patch_file), "--base", base,
                                        persistent=persistent)
            done, push_peak = suite.snapver(net, "push", name, NODE, "--yes", "--json", persistent=persistent)
            _expect("snapver push wrote", sorted(json.loads(done.stdout)["results"][0]["written"]), sorted(PUSHED))
            check_pushed()
            return max(peak, push_peak)
        return body

    def rsync(_round: int) -> int:
        state["dirty"] = "rsync"
        peak = run_measured(suite.rsync(net, NODE, "-aR", *(f"{patched}/./{p}" for p in PUSHED),
                                        suite.remote(net, NODE, f"{site}/")))[1]
        check_pushed()
        return peak

    def scp(_round: int) -> int:
        state["dirty"] = "scp"
        peak = 0
        for path in PUSHED:
            peak = max(peak, run_measured(suite.scp(net, NODE, "-q", str(patched / path),
                                                    suite.remote(net, NODE, site / path)))[1])
        check_pushed()
        return peak

    try:
        suite.measure("push", net, [
            ("snapver", snapver_push(False), restore, False),
            (PERSIST, snapver_push(True), restore, False),
            ("rsync -a (2 files)", rsync, restore, False),
            ("scp (2 files)", scp, restore, False),
        ], {"snapver": "rsync -a (2 files)", PERSIST: "rsync -a (2 files)", "scp (2 files)": "snapver"})
    finally:
        restore()


RUNNERS: dict[str, Callable[[Suite, Network], None]] = {
    "first-pull": first_pull, "re-pull": re_pull, "change-pull": change_pull,
    "diff": diff, "status": status, "push": push,
    **{scenario: container.runner(scenario, NODE, CHANGED) for scenario in container.SCENARIOS},
}
# The snapver commands each scenario needs; a scenario whose command is missing prints "not available".
NEEDS = {"first-pull": ["pull"], "re-pull": ["pull"], "change-pull": ["pull"], "diff": ["pull", "diff"],
         "status": ["pull", "status"], "push": ["pull", "show", "patch", "push", "rollback"],
         "container-pull": ["pull"], "container-re-pull": ["pull"], "container-diff": ["pull", "diff"]}


def missing_commands(env: BenchEnv) -> set[str]:
    missing = set()
    for command in sorted({c for needs in NEEDS.values() for c in needs}):
        done = run([*env.snapver_argv, command, "--help"], check=False, env=env.env(), cwd=env.work)
        if done.returncode != 0:
            missing.add(command)
    return missing


# -- output ---------------------------------------------------------------------------------
def format_table(rows: Sequence[Row]) -> str:
    header = ("scenario", "network", "tool", "runs", "median s", "min s", "max s", "peak MiB", "ratio", "load")
    lines = []
    for row in rows:
        if not row.times:
            lines.append((row.scenario, row.network, row.tool, "-", "-", "-", "-", "-", row.note, f"{row.load:.2f}"))
            continue
        value = ratio(row, rows)
        lines.append((row.scenario, row.network, row.tool, str(len(row.times)), f"{median(row.times):.3f}",
                      f"{min(row.times):.3f}", f"{max(row.times):.3f}",
                      f"{max(row.peaks_kib) / 1024:.0f}" if row.peaks_kib else "-",
                      f"{value:.2f}x {row.reference}" if value is not None else "", f"{row.load:.2f}"))
    widths = [max(len(str(line[i])) for line in [header, *lines]) for i in range(len(header))]
    numeric = {3, 4, 5, 6, 7, 9}
    out = []
    for line in [header, *lines]:
        out.append("  ".join(str(cell).rjust(widths[i]) if i in numeric else str(cell).ljust(widths[i])
                             for i, cell in enumerate(line)).rstrip())
    return "\n".join(out)


def bar_verdicts(rows: Sequence[Row]) -> list[dict[str, Any]]:
    verdicts = []
    for scenario, network, top, bottom, op, limit in BARS:
        a, b = find_row(rows, scenario, network, top), find_row(rows, scenario, network, bottom)
        if a is None or b is None or not a.times or not b.times:
            continue
        value = median(a.times) / median(b.times)
        met = value <= limit if op == "<=" else value >= limit
        verdicts.append({"scenario": scenario, "network": network, "ratio": f"{top} / {bottom}",
                         "value": value, "bar": f"{op} {limit:g}", "met": met})
    return verdicts


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="interleaved timed rounds per scenario (default 5)")
    parser.add_argument("--slow-runs", type=int, default=1,
                        help="runs of the scp-based cases over rtt20 (minutes each; default 1, 0 skips them)")
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, metavar="NAME",
                        help=f"run only this scenario (repeatable): {', '.join(SCENARIOS)}")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--rtt-only", action="store_true", help="only through the 20 ms RTT delay proxy")
    only.add_argument("--loopback-only", action="store_true", help="only over plain loopback")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    parser.add_argument("--env-cost", action="store_true",
                        help="also time each pull with environment = false (what recording the environment costs)")
    add_node_home_option(parser)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    scenarios = [s for s in SCENARIOS if s in (args.scenario or SCENARIOS)]
    networks = ["rtt20"] if args.rtt_only else ["loopback"] if args.loopback_only else ["loopback", "rtt20"]
    started = time.time()
    load_before = uptime()
    print(f"start: {load_before}", file=sys.stderr)
    with bench_env(keep=args.keep, node_home=args.node_home, client=args.client_python) as env:
        suite = Suite(env, args.runs, args.slow_runs, env_cost=args.env_cost)
        try:
            missing = missing_commands(env)
            suite.build(networks)
            files = [p for p in suite.tree(NODE).rglob("*") if not p.is_dir()]
            tree_info = {"files": len(files), "bytes": sum(p.lstat().st_size for p in files)}
            for scenario in scenarios:
                for name in networks:
                    lacking = [c for c in NEEDS[scenario] if c in missing]
                    if lacking:
                        note = f"snapver {', '.join(lacking)}: not available"
                        suite.unavailable.append(f"{scenario}/{name}: {note}")
                        suite.rows.append(Row(scenario, name, "snapver", note=note))
                        continue
                    try:
                        RUNNERS[scenario](suite, suite.networks[name])
                    except RuntimeError as exc:  # a failed check or command: report it, go on
                        first = str(exc).splitlines()[0][:200]
                        print(f"[{scenario} / {name}] FAILED: {exc}", file=sys.stderr)
                        suite.unavailable.append(f"{scenario}/{name}: failed: {first}")
                        suite.rows.append(Row(scenario, name, "snapver", note=f"failed: {first}"))
        finally:
            suite.close()
    load_after = uptime()
    rows, verdicts = suite.rows, bar_verdicts(suite.rows)
    if args.json:
        print(
            json.dumps(
                {
                    "command": " ".join(["python3", "bench/suite.py", *sys.argv[1:]]),
                    "runs": args.runs,
                    "slow_runs": args.slow_runs,
                    "tree": tree_info,
                    "nproc": os.cpu_count(),
                    "proxy_delay_ms_each_way": PROXY_DELAY_MS,
                    "node_home": args.node_home,
                    "load_before": load_before,
                    "load_after": load_after,
                    "seconds": round(time.time() - started, 1),
                    "rows": [r.to_json(rows) for r in rows],
                    "bars": [{**v, "value": round(v["value"], 4)} for v in verdicts],
                    "not_available": suite.unavailable,
                },
                indent=2,
            )
        )
        return 1 if suite.unavailable else 0
    print(f"snapver benchmark suite: sglang/srt, {tree_info['files']} files, {tree_info['bytes'] / 1e6:.1f} MB; "
          f"{args.runs} interleaved runs (+1 warm-up), medians; rtt20 = {2 * PROXY_DELAY_MS:g} ms RTT delay proxy; "
          f"node sessions' HOME: {args.node_home}")
    print(f"before: {load_before}\nafter:  {load_after}  ({time.time() - started:.0f} s, {os.cpu_count()} cores)\n")
    print(format_table(rows))
    notes = sorted({row.note for row in rows if row.note and row.times})
    for note in notes:
        print(f"  note: {note}: " + ", ".join(f"{r.scenario}/{r.network}/{r.tool}" for r in rows if r.note == note))
    if verdicts:
        print("\nbars (median ratios):")
        for v in verdicts:
            print(f"  {v['scenario']:<17} {v['network']:<8} {v['ratio']:<40} {v['value']:>7.2f}  "
                  f"bar {v['bar']:<6} {'met' if v['met'] else 'NOT MET'}")
    for line in suite.unavailable:
        print(f"  not available: {line}")
    return 1 if suite.unavailable else 0


if __name__ == "__main__":
    sys.exit(main())
