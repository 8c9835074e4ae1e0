"""Shared helpers for the benchmarks in ``bench/`` (not a test suite).

A benchmark starts its own OpenSSH server on loopback (the same server the test
fixture starts: ``tests/conftest.py``), builds nodes from the real sglang wheel,
times its cases *interleaved* (one run of each case per round, so drift in the
machine's load hits every case alike) and prints medians and ratios.

Typical use::

    with bench_env() as env:                      # sshd + scratch folder + HOME
        site = env.build_node("ct200")            # the wheel unpacked: a node's site-packages
        timings = interleave([Case("snapver", run=...), Case("rsync -a", run=...)], runs=5)
        print_table("first pull", timings, ratios={"snapver": "rsync -a"})
"""

from __future__ import annotations

import argparse
import os
import shutil
import site
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
TESTS_DIR = REPO_ROOT / "tests"
if str(TESTS_DIR) not in sys.path:
    sys.path.insert(0, str(TESTS_DIR))

# The fixture's own sshd and wheel code, so the benchmark measures the same setup the tests use.
import conftest as fixtures  # noqa: E402
from helpers import Sshd, toml_dumps  # noqa: E402

TIME_BINARY = "/usr/bin/time"  # GNU time: -f %M is the peak resident set in KiB

__all__ = ["BenchEnv", "Case", "bench_env", "bench_main", "find_wheel", "interleave", "median", "print_table",
           "print_verdicts", "run",
           "run_measured", "run_measured_all"]


@dataclass
class Case:
    """One thing to time: ``setup(round)`` runs untimed before each ``run(round)``."""

    name: str
    run: Callable[[int], Any]
    setup: Callable[[int], Any] | None = None


@dataclass
class BenchEnv:
    """A running sshd, a scratch folder and an isolated HOME for one benchmark."""

    sshd: Sshd
    work: Path
    home: Path
    wheel: Path
    python: str = sys.executable  # the interpreter snapver runs under (``client_python``)
    _built: list[Path] = field(default_factory=list)

    # -- nodes --------------------------------------------------------------------
    def build_node(self, name: str, copy_of: Path | None = None) -> Path:
        """A node's deployment as on a real GPU node: a venv (``python -m venv``, this
        machine's Python) at ``work/nodes/NAME/venv`` whose site-packages holds the sglang
        wheel unpacked (modes kept), or a ``cp -a`` of ``copy_of``'s contents (same bytes,
        modes, times). Returns the site-packages folder."""
        venv = self.work / "nodes" / name / "venv"
        run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        site_packages = venv / "lib" / version / "site-packages"
        if copy_of is None:
            fixtures._unpack_wheel(self.wheel, site_packages)
        else:
            run(["cp", "-a", f"{copy_of}/.", str(site_packages)])
        return site_packages

    def node_table(self, name: str, site_packages: Path, **extra: Any) -> dict[str, Any]:
        """A ``[nodes.NAME]`` table reaching ``name``'s loopback address through the sshd."""
        return {
            "host": self.sshd.addresses[name],
            "port": self.sshd.port,
            "user": "root",
            "site_packages": str(site_packages),
            "identity_file": str(self.sshd.identity_file),
            "known_hosts": str(self.sshd.known_hosts),
            "host_key_policy": "strict",
            "connect_timeout": 10,
            **extra,
        }

    def write_config(self, folder: Path, nodes: Mapping[str, Mapping[str, Any]],
                     store: str = "snapshots") -> Path:
        """Write ``folder/.snapver`` naming ``nodes`` and a store beside it."""
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / ".snapver"
        path.write_text(toml_dumps({"store": {"path": store}, "nodes": dict(nodes)}), encoding="utf-8")
        return path

    # -- commands -------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment every timed command runs in: isolated HOME, the working tree first."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GIT_", "SNAPVER_")) and k != "SSH_AUTH_SOCK"}
        env.update(HOME=str(self.home), XDG_CONFIG_HOME=str(self.home / ".config"),
                   GIT_CONFIG_NOSYSTEM="1", NO_COLOR="1",
                   PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")])))
        return env

    @property
    def snapver_argv(self) -> list[str]:
        """``python -m snapver`` with the client's Python (``client_python``)."""
        return [self.python, "-m", "snapver"]

    def snapver(self, *args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess[bytes]:
        """Run ``python -m snapver ARGS`` (this checkout) in ``cwd``."""
        return run([*self.snapver_argv, *args], cwd=cwd, env=self.env(), check=check)

    def ssh_e(self) -> str:
        """The ``-e`` argument for rsync (and the options for scp/ssh): key, port, known_hosts only."""
        return " ".join(["ssh", *self.ssh_options()])

    def ssh_options(self, port_flag: str = "-p") -> list[str]:
        """OpenSSH client options that read nothing of the developer's ``~/.ssh``."""
        return ["-F", "/dev/null", "-i", str(self.sshd.identity_file), port_flag, str(self.sshd.port),
                "-o", f"UserKnownHostsFile={self.sshd.known_hosts}", "-o", "IdentitiesOnly=yes",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "BatchMode=yes"]

    def scp(self, *args: str) -> list[str]:
        """An ``scp`` command line with the same options (scp spells the port ``-P``)."""
        return ["scp", *self.ssh_options("-P"), *args]

    def remote(self, name: str, path: Path | str) -> str:
        """``root@ADDRESS:PATH`` for node ``name``."""
        return f"root@{self.sshd.addresses[name]}:{path}"


def baseline_env(env: BenchEnv, baseline: str, base: dict[str, str]) -> dict[str, str]:
    """``base`` running the snapver of git revision ``baseline`` (``git archive``, compiled)."""
    folder = env.work / "baseline"
    folder.mkdir(exist_ok=True)
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", baseline, "snapver"], capture_output=True,
                             check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(folder / "snapver")], check=True)
    return {**base, "PYTHONPATH": str(folder)}


def run(command: Sequence[str], check: bool = True, **kwargs: Any) -> subprocess.CompletedProcess[bytes]:
    """Run a command with no stdin, capture its output, fail loudly (with it) if asked."""
    completed = subprocess.run(list(command), stdin=subprocess.DEVNULL, capture_output=True, **kwargs)
    if check and completed.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, command))} exited {completed.returncode}:\n"
            f"{completed.stdout.decode(errors='replace')}{completed.stderr.decode(errors='replace')}")
    return completed


def run_measured_all(commands: Sequence[Sequence[str]], check: bool = True,
                     **kwargs: Any) -> list[tuple[subprocess.CompletedProcess[bytes], int]]:
    """Run ``commands`` at once (no stdin, output captured); wait for all of them.

    Returns ``(completed, peak KiB)`` per command: the largest resident set of the
    command and of every child it waited for, as ``/usr/bin/time -f %M`` reports it.
    (Not this process's own wait4/RUSAGE_CHILDREN: a child forked from here starts
    with this Python's resident set as its high-water mark, and RUSAGE_CHILDREN only
    ever grows.)
    """
    started = []
    for command in commands:
        stdout, stderr = tempfile.TemporaryFile(), tempfile.TemporaryFile()
        report = tempfile.NamedTemporaryFile(prefix="bench-time-", delete=False)
        report.close()
        process = subprocess.Popen([TIME_BINARY, "-f", "%M", "-o", report.name, *command],
                                   stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, **kwargs)
        started.append((command, process, stdout, stderr, Path(report.name)))
    results = []
    for command, process, stdout, stderr, report in started:
        process.wait()
        outputs = []
        for handle in (stdout, stderr):
            handle.seek(0)
            outputs.append(handle.read())
            handle.close()
        lines = report.read_text().split()
        report.unlink()
        completed = subprocess.CompletedProcess(list(command), process.returncode, *outputs)
        if check and completed.returncode != 0:
            raise RuntimeError(
                f"{' '.join(map(str, command))} exited {completed.returncode}:\n"
                f"{outputs[0].decode(errors='replace')}{outputs[1].decode(errors='replace')}")
        results.append((completed, int(lines[-1]) if lines and lines[-1].isdigit() else 0))
    return results


def machine_cpu_seconds() -> float:
    """CPU time every process on this machine has used since boot (/proc/stat, all cores):
    the difference around a run is what it cost the whole machine, nodes included."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run_measured(command: Sequence[str], check: bool = True,
                 **kwargs: Any) -> tuple[subprocess.CompletedProcess[bytes], int]:
    """``run`` that also returns the command's peak resident memory in KiB (see ``run_measured_all``)."""
    return run_measured_all([command], check=check, **kwargs)[0]


def _start_one_sshd(folder: Path, port: int, addresses: Sequence[str],
                    session_env: Mapping[str, str] | None = None) -> tuple[list[subprocess.Popen[bytes]], str]:
    """One sshd process listening on ``addresses`` (at most 16: OpenSSH's limit per process)."""
    if len(addresses) > fixtures.MAX_LISTEN_SOCKS:
        raise ValueError(f"one sshd listens on at most {fixtures.MAX_LISTEN_SOCKS} addresses")
    config = folder / "sshd_config.0"
    config.write_text(fixtures._sshd_config(folder, port, list(addresses), 0, session_env))
    pid_file = folder / "sshd.0.pid"
    pid_file.unlink(missing_ok=True)
    with open(folder / "sshd.log", "ab") as log:
        process = subprocess.Popen([fixtures.SSHD_BINARY, "-D", "-e", "-f", str(config)],
                                   stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and process.poll() is None and not pid_file.exists():
        time.sleep(0.02)
    refused = [a for a in addresses if not fixtures._accepts(a, port)] if pid_file.exists() else list(addresses)
    if process.poll() is None and not refused:
        return [process], ""
    fixtures._stop([process])
    return [], f"sshd exited with {process.returncode}" if process.returncode else f"port {port} refused"


NODE_HOMES = ("clean", "root")
CLIENT_PYTHONS = ("installed", "system")


def add_node_home_option(parser: argparse.ArgumentParser) -> None:
    """``--node-home`` and ``--client-python``: the two settings of this machine a timing depends on."""
    parser.add_argument("--node-home", choices=NODE_HOMES, default="clean",
                        help="HOME of node sessions: an empty one (default), or root's own, whose "
                        ".bashrc runs this machine's start-up (pyenv) in every SSH session")
    parser.add_argument("--client-python", choices=CLIENT_PYTHONS, default="installed",
                        help="the Python snapver runs under: a venv of its own, as `pipx install` makes "
                        "(default), or this machine's, whose site-packages runs .pth start-up hooks")


def client_python(work: Path, kind: str = "installed") -> str:
    """The interpreter snapver's commands run under.

    ``installed``: a venv of its own in ``work``, as ``pipx install snapver`` makes, whose
    site-packages only names this Python's (a ``.pth`` line that is a path: the packages
    are found there, and that folder's own ``.pth`` files are not run). This machine's
    site-packages runs two start-up hooks in every Python process, which a user's
    install has neither of: a sandbox's CA injector (imports certifi, importlib.resources,
    tempfile, zipfile) and the editable install's finder: ~40 ms of CPU per start
    (``python -X importtime -c pass``: site 40 ms; 2.5 ms in such a venv). rsync, ssh and
    git pay nothing like it. ``system``: this Python as it is (``sys.executable``).
    """
    if kind == "system":
        return sys.executable
    if kind != "installed":
        raise ValueError(f"client python: {kind!r}, not one of {CLIENT_PYTHONS}")
    venv = work / "client-venv"
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "lib" / version / "site-packages" / "snapver-deps.pth").write_text(
        "".join(f"{folder}\n" for folder in site.getsitepackages()))
    return str(venv / "bin" / "python")


def find_wheel() -> Path:
    """The sglang wheel in ``../shared/fixtures`` (beside the repo)."""
    wheels = sorted(fixtures.FIXTURES_DIR.glob("sglang-*.whl"))
    if not wheels:
        raise SystemExit(f"no sglang wheel in {fixtures.FIXTURES_DIR}")
    return wheels[-1]


@contextmanager
def bench_env(keep: bool = False, addresses: Mapping[str, str] | None = None,
              node_home: str = "clean", client: str = "installed") -> Iterator[BenchEnv]:
    """Start sshd on loopback (random port, own keys) in a scratch folder; stop and delete on exit.

    ``addresses`` (node name -> loopback address, at most 16): one sshd process listening
    on exactly those, instead of the fixture's (two processes for its 18 addresses).

    ``node_home``: the HOME of node sessions. Every session's login shell (rsync's, scp's
    and snapver's alike) runs that HOME's ``~/.bashrc``. The bench nodes are all root on
    this one machine, and root's .bashrc here runs ``pyenv init`` (~0.14 s of CPU, and a
    rehash lock that all sessions share: 16 shells at once took 2 s). A real fleet runs
    each node's shell start-up on that node's own CPUs, so by default (``clean``) node
    sessions get an empty HOME of their own; ``root`` keeps root's (see --node-home).
    """
    if node_home not in NODE_HOMES:
        raise ValueError(f"node_home: {node_home!r}, not one of {NODE_HOMES}")
    node_addresses = dict(fixtures.NODE_ADDRESSES if addresses is None else addresses)
    if not os.access(fixtures.SSHD_BINARY, os.X_OK):
        raise SystemExit(f"{fixtures.SSHD_BINARY} is missing: run `bash scripts/test.sh` once to install it")
    # Byte-compile snapver as `pip install` does: with PYTHONDONTWRITEBYTECODE set (as on
    # these machines) every timed command would otherwise compile its modules from source.
    run([sys.executable, "-m", "compileall", "-q", str(REPO_ROOT / "snapver")])
    scratch = Path(tempfile.mkdtemp(prefix="snapver-bench-"))
    processes: list[subprocess.Popen[bytes]] = []
    try:
        folder = scratch / "sshd"
        folder.mkdir()
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        fixtures._keygen(folder / "host_ed25519", "snapver-bench-host")
        fixtures._keygen(folder / "user_ed25519", "snapver-bench-user")
        (folder / "authorized_keys").write_text((folder / "user_ed25519.pub").read_text())
        host_key = " ".join((folder / "host_ed25519.pub").read_text().split()[:2])
        session_env: dict[str, str] = {}
        if node_home == "clean":
            (scratch / "node-home").mkdir()
            session_env["HOME"] = str(scratch / "node-home")
        why = ""
        for _attempt in range(5):
            port = fixtures._free_port()
            processes, why = (fixtures._start_sshd(folder, port, session_env) if addresses is None
                              else _start_one_sshd(folder, port, list(node_addresses.values()), session_env))
            if processes:
                break
        else:
            raise SystemExit(f"could not start sshd: {why}\n{(folder / 'sshd.log').read_text()}")
        known_hosts = folder / "known_hosts"
        known_hosts.write_text("".join(f"[{a}]:{port} {host_key}\n" for a in node_addresses.values()))
        sshd = Sshd(port=port, identity_file=folder / "user_ed25519", known_hosts=known_hosts,
                    host_public_key=host_key, addresses=node_addresses, dir=folder)
        home = scratch / "home"
        home.mkdir()
        work = scratch / "work"
        work.mkdir()
        yield BenchEnv(sshd=sshd, work=work, home=home, wheel=find_wheel(), python=client_python(work, client))
    finally:
        fixtures._stop(processes)
        if keep:
            print(f"kept {scratch}", file=sys.stderr)
        else:
            shutil.rmtree(scratch, ignore_errors=True)


def interleave(cases: Sequence[Case], runs: int, warmup: int = 1,
               progress: bool = True) -> dict[str, list[float]]:
    """Time every case ``runs`` times, one of each per round; ``warmup`` rounds are not kept.

    Returns ``{case name: [seconds per kept round]}``.
    """
    timings: dict[str, list[float]] = {case.name: [] for case in cases}
    for round_index in range(warmup + runs):
        for case in cases:
            if case.setup is not None:
                case.setup(round_index)
            began = time.perf_counter()
            case.run(round_index)
            elapsed = time.perf_counter() - began
            if round_index >= warmup:
                timings[case.name].append(elapsed)
        if progress:
            kept = "warm-up" if round_index < warmup else f"run {round_index - warmup + 1}/{runs}"
            line = ", ".join(f"{case.name} {timings[case.name][-1]:.3f}s" if timings[case.name]
                             and round_index >= warmup else case.name for case in cases)
            print(f"  {kept}: {line}", file=sys.stderr, flush=True)
    return timings


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def print_table(title: str, timings: Mapping[str, Sequence[float]],
                ratios: Mapping[str, str] | None = None) -> dict[str, float]:
    """Print one table: case, runs, median, min, max, and ``case / reference`` for each pair in ``ratios``.

    Returns ``{"A / B": median ratio}`` for the pairs asked.
    """
    ratios = ratios or {}
    width = max([len(name) for name in timings] + [4])
    print(f"\n{title}")
    print(f"  {'case':<{width}}  runs  median s   min s    max s   ratio")
    found: dict[str, float] = {}
    for name, values in timings.items():
        reference = ratios.get(name)
        ratio = ""
        if reference is not None:
            value = median(values) / median(timings[reference])
            found[f"{name} / {reference}"] = value
            ratio = f"{value:.2f}x {reference}"
        print(f"  {name:<{width}}  {len(values):>4}  {median(values):>8.3f} {min(values):>7.3f}  "
              f"{max(values):>7.3f}   {ratio}")
    return found


def print_verdicts(ratios: Mapping[str, float], names: Sequence[str], bar: float) -> None:
    """One line per ratio in ``names``: its value and whether it is within ``bar``."""
    for name in names:
        verdict = "within" if ratios[name] <= bar else "OVER"
        print(f"  {name}: {ratios[name]:.2f}x ({verdict} the {bar:g}x bar)")


def bench_main(bench: Callable[[BenchEnv, int], Any], description: str | None, default_runs: int) -> int:
    """The command line every benchmark shares: ``[--runs N] [--keep] [--node-home H]``, then ``bench(env, runs)``."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=default_runs, help=f"timed rounds (default {default_runs})")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder")
    add_node_home_option(parser)
    args = parser.parse_args()
    with bench_env(keep=args.keep, node_home=args.node_home, client=args.client_python) as env:
        bench(env, args.runs)
    return 0
