"""Benchmark: a big tree with huge files — the real PyTorch wheel's ``torch/`` — snapver vs rsync.

    python3 bench/big_tree.py [--runs N] [--keep] [--node-home clean|root] [--skip-store]

The ``torch/`` tree of the real PyTorch 2.14.1 wheel (12,016 files,
1.14 GB; ``libtorch_cuda.so`` 503 MB and ``libtorch_cpu.so`` 446 MB are most of it) is
unpacked into a node's venv behind a loopback OpenSSH server (``common.bench_env``, as
``suite.py`` does). The wheel is fetched with ``pip download --no-deps torch==2.14.1``
into a cache outside the repository when it is missing: ``$SNAPVER_BENCH_TORCH_CACHE``,
else ``../cache/torch`` beside the checkout. It is never committed.

Interleaved rounds (one warm-up round not kept), medians:

  first pull        snapver pull into a fresh store   vs  rsync -a into a fresh folder
  re-pull           snapver pull, nothing changed     vs  rsync -a re-run onto its copy
  diff              snapver diff -q, one file changed vs  rsync -anc -i against a copy

Every first pull and first copy goes into a folder never used before (ext4 creates
files slowly for minutes after mass deletions, which would skew the copy that follows
a delete); they are all deleted at the end. Peak memory: the client's is GNU
``/usr/bin/time -f %M`` (the command and the children it waited for); the node agent's
is its VmHWM in ``/proc`` (it runs on this machine), polled every 20 ms in one extra,
untimed run per scenario (the poller's CPU would otherwise weigh on snapver's timed runs
only). Then, once, untimed against the rivals: the store's compaction
(``python -m snapver.store.gc``, the background repack a pull starts) with its wall
time and peak memory, and the store's size after it against a plain ``git add -A`` +
``git commit`` + ``git gc`` of the same tree.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import (  # noqa: E402
    REPO_ROOT,
    BenchEnv,
    Case,
    add_node_home_option,
    baseline_env,
    bench_env,
    interleave,
    print_table,
    run,
    run_measured,
)

TORCH_VERSION = "2.14.1"
CACHE_ENV = "SNAPVER_BENCH_TORCH_CACHE"
NODE = "ct200"
TRACKED = "torch"
CHANGED = "torch/version.py"  # the one file the diff scenario changes (small, plain text)
AGENT_MARK = "snapver-agent"  # in the bootstrap every agent's command line holds (transport/base.py)


def torch_wheel() -> Path:
    """The cached PyTorch wheel; ``pip download`` it into the cache first if missing."""
    cache = Path(os.environ.get(CACHE_ENV) or REPO_ROOT.parent / "cache" / "torch").resolve()
    if REPO_ROOT in cache.parents or cache == REPO_ROOT:
        raise SystemExit(f"{CACHE_ENV}={cache} is inside the repository: the wheel must never be committed")
    pattern = f"torch-{TORCH_VERSION}-*.whl"
    found = sorted(cache.glob(pattern))
    if not found:
        cache.mkdir(parents=True, exist_ok=True)
        print(f"downloading torch=={TORCH_VERSION} into {cache} ...", file=sys.stderr, flush=True)
        run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", f"torch=={TORCH_VERSION}",
             "-d", str(cache)])
        found = sorted(cache.glob(pattern))
    if not found:
        raise SystemExit(f"pip download left no {pattern} in {cache}")
    return found[-1]


def unpack_tree(wheel: Path, prefix: str, destination: Path) -> None:
    """Unzip the wheel's members under ``prefix/`` with their recorded modes (two threads)."""
    with zipfile.ZipFile(wheel) as archive:
        members = [m for m in archive.infolist() if m.filename.startswith(prefix + "/")]
    for member in members:
        if ".." in member.filename.split("/"):
            raise SystemExit(f"{wheel.name}: unsafe member {member.filename!r}")
        target = destination / member.filename
        (target if member.is_dir() else target.parent).mkdir(parents=True, exist_ok=True)
    files = [m for m in members if not m.is_dir()]
    # The two big .so first, one per thread, so neither thread ends with both.
    files.sort(key=lambda m: -m.file_size)

    def extract(share: list[zipfile.ZipInfo]) -> None:
        with zipfile.ZipFile(wheel) as archive:
            for member in share:
                with archive.open(member) as source, open(destination / member.filename, "wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(extract, [files[0::2], files[1::2]]))
    for member in members:
        mode = (member.external_attr >> 16) & 0o7777
        if mode:
            os.chmod(destination / member.filename, mode)


def build_torch_node(env: BenchEnv, wheel: Path) -> Path:
    """A venv whose site-packages holds the wheel's ``torch/`` tree; returns the site-packages."""
    venv = env.work / "nodes" / NODE / "venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    site_packages = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    unpack_tree(wheel, TRACKED, site_packages)
    return site_packages


def _vm_hwm_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def _agent_pids() -> list[int]:
    """Python processes whose command line holds the agent's bootstrap (node side, this machine)."""
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/cmdline", "rb") as handle:
                argv = handle.read().split(b"\0")
        except OSError:
            continue
        if argv and b"python" in os.path.basename(argv[0]) and any(AGENT_MARK.encode() in a for a in argv[1:]):
            pids.append(int(entry.name))
    return pids


@contextmanager
def agent_peak(poll: bool = True) -> Iterator[dict[str, int]]:
    """Poll every agent's VmHWM while the body runs; ``result["kib"]``: the largest seen
    (0 when not ``poll``)."""
    result = {"kib": 0}
    if not poll:
        yield result
        return
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            for pid in _agent_pids():
                result["kib"] = max(result["kib"], _vm_hwm_kib(pid))
            stop.wait(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        yield result
    finally:
        stop.set()
        poller.join()


def du_bytes(path: Path) -> int:
    """Bytes the files under ``path`` hold (apparent sizes)."""
    return sum(p.lstat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


class BigTree:
    """The node, the project configs, and the cases of one benchmark run."""

    def __init__(self, env: BenchEnv, site_packages: Path) -> None:
        self.env = env
        self.site = site_packages
        self.tree = site_packages / TRACKED
        self.runs_dir = env.work / "runs"
        self.runs_dir.mkdir()
        self.baseline: tuple[str, dict[str, str]] | None = None  # (revision, its env): --baseline
        self.peaks: dict[str, list[tuple[int, int]]] = {}  # case -> [(client KiB, agent KiB)] per run
        files = [p for p in self.tree.rglob("*") if p.is_file() and not p.is_symlink()]
        self.files = len(files)
        self.bytes = sum(p.lstat().st_size for p in files)
        self.changes = 0
        self.synced: dict[str, Path] = {}  # the re-pull's project and rsync copy, reused by the diff
        # Poll the agent's memory only in an extra, untimed run per scenario: the poller scans
        # /proc every 20 ms, CPU the rival's timed runs would not share on two cores.
        self.poll_agent = False

    def project(self, name: str) -> Path:
        """A project folder whose ``.snapver`` tracks ``torch`` on the node; store ``snapshots``."""
        folder = self.runs_dir / name
        node = self.env.node_table(NODE, self.site, paths=[TRACKED])
        self.env.write_config(folder, {NODE: node})
        return folder

    def snapver(self, case: str, project: Path, *args: str, codes: tuple[int, ...] = (0,),
                env: dict[str, str] | None = None) -> bytes:
        """Run snapver (auto compaction off, as in suite.py) with client and agent peaks recorded;
        ``env``: another snapver's (``--baseline``)."""
        env = {**(env or self.env.env()), "SNAPVER_AUTO_GC": "0"}
        with agent_peak(self.poll_agent) as agent:
            done, client_kib = run_measured([*self.env.snapver_argv, *args], check=False,
                                            cwd=project, env=env)
        if done.returncode not in codes:
            raise RuntimeError(f"snapver {' '.join(args)} exited {done.returncode}:\n"
                               f"{done.stdout.decode(errors='replace')}{done.stderr.decode(errors='replace')}")
        self.peaks.setdefault(case, []).append((client_kib, agent["kib"]))
        return done.stdout

    def rsync(self, case: str, *args: str) -> bytes:
        done, client_kib = run_measured(["rsync", *args, "-e", self.env.ssh_e()])
        self.peaks.setdefault(case, []).append((client_kib, 0))
        return done.stdout

    def remote_tree(self) -> str:
        return self.env.remote(NODE, f"{self.tree}/")

    def change_file(self) -> None:
        self.changes += 1
        with open(self.site / CHANGED, "ab") as handle:
            handle.write(f"# benchmark hot-fix {self.changes}\n".encode())


def _itemized(output: bytes) -> list[str]:
    return [line.split(" ", 1)[1] for line in output.decode().splitlines() if line.startswith((">f", "<f"))]


def _expect(what: str, got: Any, wanted: Any) -> None:
    if got != wanted:
        raise RuntimeError(f"{what}: got {got!r}, wanted {wanted!r}")


def first_pull(bench: BigTree, runs: int) -> dict[str, list[float]]:
    """snapver's first pull into a fresh store vs rsync -a into a fresh folder."""
    names = iter(range(1 << 30))
    current: dict[str, Path] = {}

    def fresh_project(_round: int) -> None:
        current["project"] = bench.project(f"first-{next(names)}")

    def fresh_copy(_round: int) -> None:
        current["copy"] = bench.runs_dir / f"rsync-first-{next(names)}"

    def pull(_round: int) -> None:
        document = json.loads(bench.snapver("first pull: snapver", current["project"], "pull", "--json", NODE))
        _expect("first pull fetched", document["nodes"][0]["fetched_files"], bench.files)

    def rsync(_round: int) -> None:
        bench.rsync("first pull: rsync -a", "-a", bench.remote_tree(), f"{current['copy']}/")

    timings = interleave([Case("snapver", pull, fresh_project), Case("rsync -a", rsync, fresh_copy)], runs)
    with polled(bench):
        fresh_project(0)
        pull(0)
    return timings


def re_pull(bench: BigTree, runs: int) -> dict[str, list[float]]:
    """Nothing changed: snapver pull vs an rsync -a re-run onto an up-to-date copy (and the
    snapver of ``--baseline``, its own store, in the same rounds)."""
    project = bench.project("re-pull")
    copy = bench.runs_dir / "rsync-copy"
    bench.snapver("setup", project, "pull", NODE)
    run(["rsync", "-a", f"{bench.tree}/", f"{copy}/"])

    def puller(folder: Path, env: dict[str, str] | None) -> Callable[[int], None]:
        def pull(_round: int) -> None:
            node = json.loads(bench.snapver("re-pull: snapver", folder, "pull", "--json", NODE, env=env))["nodes"][0]
            _expect("re-pull fetched", (node["fetched_files"], bool(node["unchanged_since"])), (0, True))

        return pull

    def rsync(_round: int) -> None:
        _expect("rsync -a re-run sent", _itemized(bench.rsync("re-pull: rsync -a", "-a", "-i", bench.remote_tree(),
                                                              f"{copy}/")), [])

    pull = puller(project, None)
    cases = [Case("snapver", pull), Case("rsync -a", rsync)]
    if bench.baseline is not None:
        revision, env = bench.baseline
        base_project = bench.project("re-pull-baseline")
        bench.snapver("setup", base_project, "pull", NODE, env=env)
        cases.insert(1, Case(f"snapver ({revision})", puller(base_project, env)))
        bench.synced.update(base_project=base_project)
    timings = interleave(cases, runs)
    with polled(bench):
        pull(0)
    bench.synced.update(project=project, copy=copy)
    return timings


def diff(bench: BigTree, runs: int) -> dict[str, list[float]]:
    """One small file changed on the node: snapver diff -q vs rsync -anc -i against a copy."""
    project, copy = bench.synced["project"], bench.synced["copy"]
    bench.change_file()
    wanted = [CHANGED.split("/", 1)[1]]

    def differ(folder: Path, env: dict[str, str] | None) -> Callable[[int], None]:
        def snapver_diff(_round: int) -> None:
            _expect("snapver diff -q printed", bench.snapver("diff: snapver", folder, "diff", "-q", NODE, codes=(1,),
                                                             env=env), b"")

        return snapver_diff

    def rsync(_round: int) -> None:
        _expect("rsync -anc -i found", _itemized(bench.rsync("diff: rsync -anc -i", "-anc", "-i",
                                                             bench.remote_tree(), f"{copy}/")), wanted)

    snapver_diff = differ(project, None)
    cases = [Case("snapver", snapver_diff), Case("rsync -anc -i", rsync)]
    if bench.baseline is not None:
        revision, env = bench.baseline
        cases.insert(1, Case(f"snapver ({revision})", differ(bench.synced["base_project"], env)))
    timings = interleave(cases, runs)
    with polled(bench):
        snapver_diff(0)
    return timings


@contextmanager
def polled(bench: BigTree) -> Iterator[None]:
    """One more (untimed) run of a scenario with the agent's memory polled."""
    bench.poll_agent = True
    try:
        yield
    finally:
        bench.poll_agent = False


def store_sizes(bench: BigTree) -> dict[str, Any]:
    """Compaction of a first pull's store (time, peak memory, size) vs plain git add + gc of the tree."""
    project = bench.project("store")
    bench.snapver("setup", project, "pull", NODE)
    store = project / "snapshots"
    raw = du_bytes(store / "objects")
    began = time.perf_counter()
    done, gc_kib = run_measured([bench.env.python, "-m", "snapver.store.gc", str(store)], check=False,
                                env={**bench.env.env(), "SNAPVER_AUTO_GC": "1"})
    gc_seconds = time.perf_counter() - began
    _expect("compaction exit code", done.returncode, 0)
    run(["git", "--git-dir", str(store), "fsck", "--no-progress", "--connectivity-only"], env=bench.env.env())
    compacted = du_bytes(store / "objects")

    plain = bench.runs_dir / "plain.git"
    git = ["git", "--git-dir", str(plain), "--work-tree", str(bench.site)]
    env = bench.env.env()
    run(["git", "init", "-q", "--bare", str(plain)], env=env)
    # gc.auto=0: the commit's own automatic gc (12,000 loose objects) would run detached
    # and make the measured gc below refuse to start.
    run([*git, "-c", "gc.auto=0", "add", "-A", TRACKED], env=env)
    run([*git, "-c", "gc.auto=0", "-c", "user.name=bench", "-c", "user.email=bench@localhost", "commit", "-q",
         "-m", "torch"], env=env)
    began = time.perf_counter()
    _done, plain_gc_kib = run_measured([*git, "gc", "-q"], env=env)
    plain_gc_seconds = time.perf_counter() - began
    plain_size = du_bytes(plain / "objects")
    return {"raw_store_bytes": raw, "compacted_store_bytes": compacted, "compaction_s": gc_seconds,
            "compaction_peak_kib": gc_kib, "plain_git_gc_bytes": plain_size, "plain_git_gc_s": plain_gc_seconds,
            "plain_git_gc_peak_kib": plain_gc_kib, "ratio": compacted / plain_size}


def report_peaks(bench: BigTree, cases: dict[str, str]) -> None:
    print("\npeak memory (largest over the kept runs), MiB: client / node agent")
    for label, case in cases.items():
        kept = bench.peaks.get(case, [])[1:]  # the warm-up round's is not kept
        if kept:
            client = max(c for c, _a in kept) / 1024
            agent = max(a for _c, a in kept) / 1024
            print(f"  {label:<28} {client:>8.1f} / {agent:>7.1f}" if agent else f"  {label:<28} {client:>8.1f} / -")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="timed rounds per scenario (default 3, +1 warm-up)")
    parser.add_argument("--quick-runs", type=int, default=15,
                        help="timed rounds of the sub-second scenarios, re-pull and diff (default 15: "
                        "on a busy machine a few rounds of them tell noise)")
    parser.add_argument("--baseline", metavar="REV",
                        help="also time the snapver of git revision REV in the re-pull and diff rounds")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    part = parser.add_mutually_exclusive_group()
    part.add_argument("--skip-store", action="store_true", help="skip the compaction and store-size part")
    part.add_argument("--store-only", action="store_true", help="only the compaction and store-size part")
    add_node_home_option(parser)
    args = parser.parse_args()
    wheel = torch_wheel()
    uptime_before = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    started = time.time()
    with bench_env(keep=args.keep, node_home=args.node_home, client=args.client_python) as env:
        site = build_torch_node(env, wheel)
        bench = BigTree(env, site)
        if args.baseline:
            bench.baseline = (args.baseline, baseline_env(env, args.baseline, env.env()))
        print(f"big tree: {wheel.name} {TRACKED}/, {bench.files} files, {bench.bytes / 1e9:.2f} GB; "
              f"{args.runs} interleaved runs (re-pull, diff: {args.quick_runs}) (+1 warm-up), medians; loopback sshd; "
              f"snapver at {_revision()}", flush=True)
        print(f"before: {uptime_before}", flush=True)
        ratios: dict[str, float] = {}
        base = {f"snapver ({args.baseline})": "snapver"} if args.baseline else {}
        steps: list[tuple[str, Callable[[BigTree, int], dict[str, list[float]]], dict[str, str], int]] = [
            ("first pull (fresh store / fresh folder)", first_pull, {"snapver": "rsync -a"}, args.runs),
            ("unchanged re-pull", re_pull, {"snapver": "rsync -a", **base}, args.quick_runs),
            ("one-file diff -q", diff, {"snapver": "rsync -anc -i", **base}, args.quick_runs),
        ]
        for title, step, pairs, runs in [] if args.store_only else steps:
            print(f"[{title}] load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
            ratios.update({f"{title}: {k}": v for k, v in print_table(title, step(bench, runs), pairs).items()})
        if not args.store_only:
            report_peaks(bench, {"first pull: snapver": "first pull: snapver", "first pull: rsync -a":
                                 "first pull: rsync -a", "re-pull: snapver": "re-pull: snapver",
                                 "diff -q: snapver": "diff: snapver"})
        if not args.skip_store:
            print(f"[store] load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
            sizes = store_sizes(bench)
            print("\nstore after compaction vs plain git add -A + git gc of the same tree")
            print(f"  snapver store before compaction: {sizes['raw_store_bytes'] / 1e6:,.1f} MB")
            print(
                f"  snapver compaction (snapver.store.gc): {sizes['compaction_s']:.1f} s, "
                f"peak {sizes['compaction_peak_kib'] / 1024:,.0f} MiB -> {sizes['compacted_store_bytes'] / 1e6:,.1f} MB"
            )
            print(f"  plain git gc: {sizes['plain_git_gc_s']:.1f} s, peak {sizes['plain_git_gc_peak_kib'] / 1024:,.0f} "
                  f"MiB -> {sizes['plain_git_gc_bytes'] / 1e6:,.1f} MB")
            print(f"  ratio snapver / plain git: {sizes['ratio']:.2f}x")
        print("\nratios (medians, same interleaved run):")
        for name, value in ratios.items():
            print(f"  {name:<60} {value:.2f}x")
        print(f"after:  {subprocess.run(['uptime'], capture_output=True, text=True).stdout.strip()}  "
              f"({time.time() - started:.0f} s, {os.cpu_count()} cores)")
    return 0


def _revision() -> str:
    done = subprocess.run(["git", "-C", str(REPO_ROOT), "log", "-1", "--format=%h %s"], capture_output=True, text=True)
    return done.stdout.strip()[:70] or str(REPO_ROOT)


if __name__ == "__main__":
    sys.exit(main())
