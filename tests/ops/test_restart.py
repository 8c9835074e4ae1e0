"""Patches that reach the running server (issue 16): `snapver ps`, restart-needed lines after
push, restart and health hooks, on real long-running processes.

Each node is a real venv (``python -m venv``) whose site-packages holds a small sglang-like
tree; its server is a real HTTP server started from the venv's python that imports a
module of the tree and serves ``/health``. The servers are started by ``serve.sh`` (the
same script the restart hook runs) and killed at teardown.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import tree_hashes

from snapver.config import load_config
from snapver.ops.patch import import_patch
from snapver.ops.pull import pull as pull_nodes
from snapver.store.repo import Store

MODULE = "sglang/srt/app_mod.py"
SERVER = '''\
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer

import sglang.srt.app_mod as app_mod  # the tree's code: a broken module fails the start


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        code = 200 if self.path == "/health" else 404
        body = ("value %s" % app_mod.VALUE).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


HTTPServer(("127.0.0.1", int(sys.argv[1])), Health).serve_forever()
'''
# serve.sh PORT PIDFILE: stop the server of PIDFILE (if any), start a new one in its own session.
SERVE = '''\
port=$1; pidfile=$2; here=$(dirname "$0")
if [ -f "$pidfile" ]; then
  old=$(cat "$pidfile"); kill "$old" 2>/dev/null
  while kill -0 "$old" 2>/dev/null; do sleep 0.05; done
fi
setsid "$here/venv/bin/python" "$here/server.py" "$port" </dev/null >>"$here/server-$port.log" 2>&1 &
echo $! > "$pidfile"
'''


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def health(port: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as reply:
            return reply.read().decode()
    except OSError:
        return None


def wait_health(port: int, want: str | None = None, seconds: float = 15) -> str:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = health(port)
        if got is not None and (want is None or got == want):
            return got
        time.sleep(0.05)
    raise AssertionError(f"no healthy server on {port} (want {want!r})")


class VenvNode:
    """A venv on disk (site-packages = its own), its serve.sh and the servers started from it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
        version = f"python{sys.version_info.major}.{sys.version_info.minor}"
        self.site = root / "venv" / "lib" / version / "site-packages"
        for rel, text in {"sglang/__init__.py": "", "sglang/srt/__init__.py": "",
                          MODULE: "VALUE = 1\n", "sglang/srt/other.py": "X = 1\n"}.items():
            (self.site / rel).parent.mkdir(parents=True, exist_ok=True)
            (self.site / rel).write_text(text)
        (root / "server.py").write_text(SERVER)
        (root / "serve.sh").write_text(SERVE)
        self.pidfiles: list[Path] = []

    def restart_command(self, port: int, name: str = "server") -> str:
        pidfile = self.root / f"{name}.pid"
        if pidfile not in self.pidfiles:
            self.pidfiles.append(pidfile)
        return f"sh {self.root}/serve.sh {port} {pidfile}"

    def start(self, port: int, name: str = "server") -> int:
        subprocess.run(self.restart_command(port, name), shell=True, check=True)
        wait_health(port)
        return int((self.root / f"{name}.pid").read_text())

    def stop(self) -> None:
        for pidfile in self.pidfiles:
            try:
                os.kill(int(pidfile.read_text()), signal.SIGKILL)
            except (OSError, ValueError):
                pass


@pytest.fixture
def venv_nodes(tmp_path, write_config, ssh_node, isolated_env):
    """``make(names, **node_extra)`` → (nodes, config path, store): snapshotted venv nodes and
    patch `bump` (VALUE = 2) and `breaks` (an import error) for all of them."""
    made: list[VenvNode] = []

    def make(names: list[str], diffs: dict[str, bytes] | None = None, defaults: dict | None = None,
             **extra: object):
        nodes = {}
        for name in names:
            node = VenvNode(tmp_path / "nodes" / name)
            made.append(node)
            nodes[name] = node
        config_path = write_config({n: ssh_node(n, v.site, **extra) for n, v in nodes.items()},
                                   groups={"all": list(names)}, defaults=defaults)
        config = load_config(str(config_path))
        store = Store.open_or_create(config.store_path)
        assert pull_nodes(store, config.select(["all"])).exit_code == 0
        patches = {"bump": b"--- a/%s\n+++ b/%s\n@@ -1 +1 @@\n-VALUE = 1\n+VALUE = 2\n" % ((MODULE.encode(),) * 2),
                   "breaks": b"--- a/%s\n+++ b/%s\n@@ -1 +1 @@\n-VALUE = 1\n+raise ImportError('broken')\n"
                             % ((MODULE.encode(),) * 2), **(diffs or {})}
        for patch, diff in patches.items():
            import_patch(store, config, patch, diff, f"{patch}.diff", names[0], ("all",))
        return nodes, config_path, isolated_env / "snapshots"

    yield make
    for node in made:
        node.stop()


def ps_json(run_snapver, *targets: str) -> dict:
    result = run_snapver("ps", *targets, "--json")
    assert result.code == 0, result
    return {n["node"]: n for n in json.loads(result.out)["nodes"]}


def test_ps_flags_a_server_started_before_the_push_and_not_one_started_after(venv_nodes, run_snapver):
    nodes, _, _ = venv_nodes(["ct200"])
    node = nodes["ct200"]
    old_port, new_port = free_port(), free_port()
    old_pid = node.start(old_port, "old")

    found = ps_json(run_snapver, "ct200")["ct200"]
    assert [p["pid"] for p in found["processes"]] == [old_pid], found
    listed = found["processes"][0]
    assert listed["restart_needed"] is False and listed["files"] == []
    assert listed["user"] == "root" and f"{node.root}/server.py {old_port}" in listed["command"]
    assert "deployment's python" in listed["reasons"][0]

    result = run_snapver("push", "bump", "--yes")
    assert result.code == 0, result
    stale = [line for line in result.out.splitlines() if line.startswith(f"ct200: pid {old_pid} ")]
    assert len(stale) == 1 and f"{node.root}/venv/bin/python" in stale[0], result
    assert stale[0].endswith("runs code older than this push: restart it") and re.search(r" started \d\d:\d\d", stale[0]), result
    assert wait_health(old_port) == "value 1"  # the old server still runs the old code

    status = run_snapver("status", "ct200", "--json")
    assert json.loads(status.out)["nodes"][0]["restart_needed"] == 1, status
    table = run_snapver("status", "ct200")
    header = table.out.splitlines()[0].split()
    assert header[-1] == "restart" and table.out.splitlines()[1].split()[-1] == "1", table
    assert "ct200: 1 process(es) run code older than the tree" in table.out

    new_pid = node.start(new_port, "new")
    assert wait_health(new_port) == "value 2"
    found = ps_json(run_snapver, "ct200")["ct200"]
    by_pid = {p["pid"]: p for p in found["processes"]}
    assert set(by_pid) == {old_pid, new_pid}, found
    assert by_pid[old_pid]["restart_needed"] is True and by_pid[old_pid]["files"] == [MODULE]
    assert by_pid[new_pid]["restart_needed"] is False and by_pid[new_pid]["files"] == []
    assert found["restart_needed"] == 1

    text = run_snapver("ps", "ct200")
    assert text.code == 0 and "1 need a restart" in text.out and f"{MODULE}: may run old code" in text.out, text


def test_secret_looking_values_are_masked_on_the_node():
    from snapver.transport.agent import mask_command

    argv = ["python", "-m", "sglang.launch_server", "--api-key", "sk-1", "--tokenizer-path", "/t", "HF_TOKEN=hf_2",
            "--password=pw3", "--auth-token", "tok4", "--model-path", "/m", "MY_SECRET=s5", "--key", "k"]
    assert mask_command(argv) == ("python -m sglang.launch_server --api-key *** --tokenizer-path /t HF_TOKEN=*** "
                                  "--password=*** --auth-token *** --model-path /m MY_SECRET=*** --key k")
