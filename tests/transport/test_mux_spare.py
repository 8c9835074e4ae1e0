"""control_persist's warm spare: the mux starts the next command's node process in advance.

Two kinds of tests, both through the real sshd: a probe command sent through the mux
(``MuxTransport._start``) that prints its pid and its start time, so which process
served which request is plain to see; and the CLI with the real agent. The node side
of the sshd fixture is this machine, so its processes are read from /proc.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import git_blob, git_ls_tree

from snapver.config import NodeSpec, load_config
from snapver.transport.base import agent_payload
from snapver.transport.mux import MuxTransport, spec_socket_path

BOOTSTRAP = b"snapver-agent"  # in the command line of every agent process (base.agent_command)


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"waited {timeout:g} s for: {what}")
        time.sleep(0.05)


def read_proc(pid: int | str, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:  # gone, or not ours to read
        return b""


def mux_pids(spec: NodeSpec) -> list[int]:
    """The background processes serving ``spec``'s socket (this test's alone: its own key)."""
    sock = str(spec_socket_path(spec)).encode()
    return [int(p.name) for p in Path("/proc").iterdir()
            if p.name.isdigit() and b"snapver.transport.mux" in (argv := read_proc(p.name, "cmdline"))
            and sock in argv.split(b"\0")]


def mux_client_port(pid: int, sshd_port: int) -> int:
    """The local TCP port of the mux's SSH connection (the node sees it in SSH_CONNECTION)."""
    inodes = {os.readlink(f"/proc/{pid}/fd/{fd}")[8:-1] for fd in os.listdir(f"/proc/{pid}/fd")
              if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")}
    for line in read_proc(pid, "net/tcp").decode().splitlines()[1:]:
        fields = line.split()
        local, remote, inode = fields[1], fields[2], fields[9]
        if inode in inodes and int(remote.split(":")[1], 16) == sshd_port:
            return int(local.split(":")[1], 16)
    raise AssertionError(f"mux {pid} holds no connection to port {sshd_port}")


def node_processes(client_port: int, sshd_port: int) -> dict[int, bytes]:
    """pid → command line of every process sshd started for that one SSH connection."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        for var in read_proc(proc.name, "environ").split(b"\0"):
            if var.startswith(b"SSH_CONNECTION="):
                _client, port, _server, server_port = var.split(b"=", 1)[1].split()
                if int(port) == client_port and int(server_port) == sshd_port:
                    found[int(proc.name)] = read_proc(proc.name, "cmdline")
    return found


@pytest.fixture
def node(sshd, make_site_packages, write_config, ssh_node, tmp_path):
    """``node(**settings)`` writes ct200 with control_persist as the project's config and
    returns its NodeSpec. A key file of its own makes the mux socket this test's alone;
    its mux ends with the test.
    """
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "x = 1\n"})
    key = tmp_path / "key"
    shutil.copy(sshd.identity_file, key)
    key.chmod(0o600)
    specs = []

    def configure(**extra) -> NodeSpec:
        settings = {"identity_file": str(key), "control_persist": 30, **extra}
        specs.append(load_config(str(write_config({"ct200": ssh_node("ct200", site, **settings)}))).nodes["ct200"])
        return specs[-1]

    yield configure
    for pid in mux_pids(specs[0]) if specs else ():
        os.kill(pid, signal.SIGTERM)


# -- the probe -----------------------------------------------------------------------
def probe(log: Path) -> str:
    """A command that logs its pid, prints pid and start time, a line on stderr, echoes its
    stdin and exits 3: blocked on stdin until a client talks to it, like the agent."""
    # The time is taken before the pid is logged: a test that sees the pid logged knows
    # the time is earlier (logged first, `date` could run after the test's own clock read).
    return (f't=$(date +%s%N); echo $$ >> {shlex.quote(str(log))}; echo "$$ $t"; echo "stderr of $$" >&2; '
            "cat; exit 3")


def started(log: Path) -> list[int]:
    return [int(line) for line in log.read_text().split()] if log.exists() else []


@dataclass
class Ran:
    pid: int
    started_ns: int
    echoed: bytes
    err: str
    status: int | None


def run_probe(spec: NodeSpec, command: str, data: bytes, handed_out: threading.Barrier | None = None) -> Ran:
    """Run the probe through the mux, sending ``data``; with ``handed_out``, wait there
    after getting the channel (so that several clients hold theirs at once)."""
    transport = MuxTransport(spec)
    channel = transport._start(command)
    assert transport._direct is None, "served by the mux, not a direct connection"
    if handed_out is not None:
        handed_out.wait(30)
    channel.stdin.write(data)
    channel.stdin.close()
    out = channel.stdout.read(1 << 24)
    err = channel.close()
    transport._disconnect()
    head, _, echoed = out.partition(b"\n")
    pid, started_ns = map(int, head.split())
    return Ran(pid, started_ns, echoed, err, channel.stdout.exit_status)


def test_the_next_command_gets_the_spare_already_started(node, tmp_path):
    spec = node()
    log = tmp_path / "started"
    command = probe(log)
    first = run_probe(spec, command, b"one\n")
    assert (first.echoed, first.err, first.status) == (b"one\n", f"stderr of {first.pid}\n", 3)
    wait_for(lambda: len(started(log)) == 2, "the spare, after the first command's process")
    (spare,) = set(started(log)) - {first.pid}
    asked = time.time_ns()
    second = run_probe(spec, command, b"two\n")
    assert second.pid == spare
    assert second.started_ns < asked, "the process was running before the command asked for it"
    # What the spare wrote on stderr before anyone asked, and its exit status, reach the
    # client as a fresh channel's do.
    assert (second.echoed, second.err, second.status) == (b"two\n", f"stderr of {spare}\n", 3)
    wait_for(lambda: len(started(log)) == 3, "a new spare after the hand-out")


def test_another_command_line_gets_a_fresh_channel_and_the_spare_ends(node, tmp_path):
    spec = node()
    log_a, log_b = tmp_path / "a", tmp_path / "b"
    first = run_probe(spec, probe(log_a), b"a\n")
    wait_for(lambda: len(started(log_a)) == 2, "the spare for command A")
    (spare,) = set(started(log_a)) - {first.pid}
    asked = time.time_ns()
    other = run_probe(spec, probe(log_b), b"b\n")
    assert other.pid != spare and other.pid in started(log_b)
    assert other.started_ns > asked
    assert (other.echoed, other.status) == (b"b\n", 3)
    wait_for(lambda: not Path(f"/proc/{spare}").exists(), "the unused spare's process to end")
    assert len(started(log_a)) == 2


def test_a_killed_spare_is_replaced_without_the_client_noticing(node, tmp_path):
    spec = node()
    log = tmp_path / "started"
    command = probe(log)
    first = run_probe(spec, command, b"one\n")
    wait_for(lambda: len(started(log)) == 2, "the spare")
    (spare,) = set(started(log)) - {first.pid}
    os.killpg(spare, signal.SIGKILL)  # sshd made it a session leader: the shell and its cat
    wait_for(lambda: not Path(f"/proc/{spare}").exists(), "the killed spare to be reaped")
    time.sleep(1)  # sshd reports the death over the connection; let the mux read it
    again = run_probe(spec, command, b"two\n")
    assert again.pid != spare and again.pid in started(log)
    assert (again.echoed, again.err, again.status) == (b"two\n", f"stderr of {again.pid}\n", 3)


def test_concurrent_clients_never_share_a_channel(node, tmp_path):
    spec = node()
    log = tmp_path / "started"
    command = probe(log)
    run_probe(spec, command, b"warm\n")
    wait_for(lambda: len(started(log)) == 2, "the spare")
    payloads = [f"client {n}\n".encode() * 20000 for n in range(4)]
    results: list[Ran | BaseException] = [b""] * len(payloads)  # type: ignore[list-item]
    asking, handed_out = threading.Barrier(len(payloads)), threading.Barrier(len(payloads))

    def client(n: int) -> None:
        asking.wait()
        try:
            results[n] = run_probe(spec, command, payloads[n], handed_out)
        except BaseException as exc:  # noqa: BLE001 - checked below
            results[n] = exc

    threads = [threading.Thread(target=client, args=(n,)) for n in range(len(payloads))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert all(isinstance(r, Ran) for r in results), results
    assert [r.echoed for r in results] == payloads  # type: ignore[union-attr]
    assert [r.status for r in results] == [3] * len(payloads)  # type: ignore[union-attr]
    assert len({r.pid for r in results}) == len(payloads)  # type: ignore[union-attr]


# -- the CLI, the real agent ---------------------------------------------------------
def test_a_pull_gets_an_agent_started_before_it(node, tmp_path, run_snapver):
    """The node's python is a wrapper logging each start and copying the agent's stdin."""
    log = tmp_path / "agents"
    log.mkdir()
    wrapper = tmp_path / "python-wrapper"
    wrapper.write_text(f'#!/bin/sh\necho "$$ $(date +%s%N)" >> {log}/started\ntee {log}/$$.in | python3 "$@"\n')
    wrapper.chmod(0o755)
    node(python=str(wrapper))

    def agents() -> list[tuple[int, int]]:
        text = (log / "started").read_text() if (log / "started").exists() else ""
        return [(int(pid), int(ns)) for pid, ns in (line.split() for line in text.splitlines())]

    def served() -> list[tuple[int, int]]:
        return [(pid, ns) for pid, ns in agents() if (log / f"{pid}.in").stat().st_size]

    first = run_snapver("pull", "ct200")
    assert first.code == 0, first
    wait_for(lambda: len(agents()) == 2, "the spare agent")
    asked = time.time_ns()
    second = run_snapver("pull", "ct200")
    assert second.code == 0, second
    assert "unchanged since" in second.out, second
    assert len(served()) == 2
    pid, started_ns = served()[1]
    assert started_ns < asked, "the second pull's agent was started before the pull"
    assert (log / f"{pid}.in").read_bytes().startswith(agent_payload()[0])


def test_two_pulls_at_once_through_one_mux(node, tmp_path, run_snapver, write_config, ssh_node):
    spec = node()
    other = tmp_path / "other"
    other.mkdir()
    write_config({"ct200": ssh_node("ct200", spec.site_packages, identity_file=spec.identity_file,
                                    control_persist=30)}, where=other)
    assert run_snapver("pull", "ct200").code == 0  # starts the mux, and a spare
    results = [None, None]

    def pull(n: int, cwd: Path | None) -> None:
        results[n] = run_snapver("pull", "ct200", cwd=cwd)

    threads = [threading.Thread(target=pull, args=(0, None)), threading.Thread(target=pull, args=(1, other))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert [r.code for r in results] == [0, 0], results
    assert len(mux_pids(spec)) == 1
    files = git_ls_tree(other / "snapshots", "refs/heads/nodes/ct200")
    assert git_blob(other / "snapshots", files["sglang/srt/a.py"][1]) == b"x = 1\n"


@pytest.mark.parametrize("ending", ["idle", "dropped"])
def test_nothing_is_left_on_the_node_when_the_mux_ends(node, sshd, run_snapver, ending):
    spec = node(control_persist=2)
    assert run_snapver("pull", "ct200").code == 0
    (mux,) = mux_pids(spec)
    port = mux_client_port(mux, sshd.port)
    wait_for(lambda: any(BOOTSTRAP in argv for argv in node_processes(port, sshd.port).values()),
             "the spare agent on the node")
    if ending == "dropped":
        os.kill(mux, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{mux}").exists(), "the mux to end")
    wait_for(lambda: not node_processes(port, sshd.port), "the node's processes of that connection to end")
