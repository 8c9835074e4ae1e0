"""A health URL is judged within `--health-timeout`, whatever its server does: one that
trickles a byte every 2 s is not healthy (and the push rolls back in time), a redirect is
not followed, and the node's agent leaves when the push is killed mid-poll.

Real HTTP servers on loopback (threads of this process), real venv nodes over the real
sshd (``venv_nodes`` of ``test_restart.py``).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import tree_hashes

# The venv nodes, their servers and records of test_restart.py (pytest imports test modules
# by path here: this folder is put on sys.path for a plain import of it).
if str(Path(__file__).parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).parent))
from test_restart import free_port, records, venv_nodes, wait_health  # noqa: E402, F401 - venv_nodes: a fixture

REPO_ROOT = Path(__file__).resolve().parents[2]
TRICKLE_EVERY = 2.0


class Server:
    """A TCP server on loopback answering each connection with ``answer(conn)`` in a thread."""

    def __init__(self, answer) -> None:
        self.listener = socket.socket()
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.answer = answer
        self.stopped = threading.Event()
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            try:
                conn.recv(65536)  # the request
                self.answer(conn, self.stopped)
            except OSError:
                pass

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()


def trickle(conn: socket.socket, stopped: threading.Event) -> None:
    """A status line, then a header that never ends: one byte every TRICKLE_EVERY seconds."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nX-Slow: ")
    while not stopped.wait(TRICKLE_EVERY):
        conn.sendall(b"a")


@pytest.fixture
def trickling() -> Iterator[Server]:
    server = Server(trickle)
    yield server
    server.close()


def push(*args: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen([sys.executable, "-m", "snapver", "push", "bump", "--yes", *args],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


def test_a_trickling_health_url_fails_within_the_timeout_and_rolls_back(venv_nodes, trickling) -> None:
    nodes, _, store = venv_nodes(["ct200"])
    node = nodes["ct200"]
    port = free_port()
    node.start(port)
    original = tree_hashes(node.site)
    began = time.monotonic()
    process = push("--restart", node.restart_command(port), "--health-url",
                   f"http://127.0.0.1:{trickling.port}/health", "--health-timeout", "4")
    out, err = process.communicate(timeout=90)
    elapsed = time.monotonic() - began
    text = err.decode()
    assert process.returncode == 3, (out, text)
    assert "not healthy within 4 s" in text and "Traceback" not in text, text
    assert elapsed < 45, f"took {elapsed:.1f} s"
    assert tree_hashes(node.site) == original  # rolled back
    assert records(store, "ct200")[0]["state"] == "rolled-back"
    assert wait_health(port) == "value 1"


def test_a_redirect_to_a_healthy_server_is_not_healthy(venv_nodes) -> None:
    nodes, _, store = venv_nodes(["ct200"])
    node = nodes["ct200"]
    port = free_port()
    node.start(port)
    original = tree_hashes(node.site)
    location = f"http://127.0.0.1:{port}/health".encode()  # another server's 200

    def redirect(conn: socket.socket, stopped: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 302 Found\r\nLocation: " + location + b"\r\nContent-Length: 0\r\n"
                     b"Connection: close\r\n\r\n")

    server = Server(redirect)
    try:
        process = push("--restart", node.restart_command(port), "--health-url",
                       f"http://127.0.0.1:{server.port}/health", "--health-timeout", "2")
        out, err = process.communicate(timeout=90)
    finally:
        server.close()
    text = err.decode()
    assert process.returncode == 3, (out, text)
    assert "answered 302" in text and "not followed" in text, text
    assert tree_hashes(node.site) == original
    assert records(store, "ct200")[0]["state"] == "rolled-back"


def agents_of(python_prefix: Path) -> list[int]:
    """Pids of agent processes run by a python under ``python_prefix`` (from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes() if entry.isdigit() else b""
        except OSError:
            continue
        if b"snapver-agent" in argv and str(python_prefix).encode() in argv:
            found.append(int(entry))
    return found


def test_the_agent_leaves_the_node_when_the_push_is_killed_mid_poll(venv_nodes, trickling) -> None:
    nodes, _, _ = venv_nodes(["ct200"])
    node = nodes["ct200"]
    port = free_port()
    node.start(port)
    process = push("--restart", node.restart_command(port), "--health-url",
                   f"http://127.0.0.1:{trickling.port}/health", "--health-timeout", "300")
    try:
        deadline = time.monotonic() + 60
        while not trickling.connections and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.05)
        assert trickling.connections, "the push never polled the health URL"
        assert agents_of(node.root), "no agent polling on the node"
    finally:
        process.send_signal(signal.SIGKILL)
        process.communicate(timeout=30)
    deadline = time.monotonic() + 20
    while agents_of(node.root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert agents_of(node.root) == [], "the agent kept polling after the push was killed"
