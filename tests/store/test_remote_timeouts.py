"""A stalled git remote never leaves processes behind: `snapver sync` against an ssh://
remote that accepts TCP and never answers ends with exit 3, and no `ssh` child of the
git it ran outlives it (read from /proc). The user's own GIT_SSH_COMMAND is kept, with
connect and keepalive timeouts added.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import toml_dumps
from snapver_inproc import run_inproc

REPO_ROOT = Path(__file__).resolve().parents[2]
GIT_TIMEOUT = 4


@pytest.fixture
def stalled_port() -> Iterator[int]:
    """A TCP port on loopback that accepts connections and never sends a byte."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    held: list[socket.socket] = []
    listener.settimeout(0.2)
    stop = False

    def accept() -> None:
        while not stop:
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    import threading

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop = True
        thread.join(2)
        for sock in held:
            sock.close()
        listener.close()


def ssh_processes(port: int) -> dict[int, str]:
    """``{pid: command line}`` of the ssh processes going to ``port`` (from /proc)."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        words = [word.decode(errors="replace") for word in argv if word]
        if words and os.path.basename(words[0]) == "ssh" and str(port) in words:
            found[int(entry)] = " ".join(words)
    return found


@pytest.mark.parametrize("user_ssh", ["GIT_SSH_COMMAND", "GIT_SSH"])
def test_a_stalled_ssh_remote_fails_the_sync_and_leaves_no_ssh_behind(tmp_path: Path, stalled_port: int,
                                                                        make_site_packages, local_node,
                                                                        user_ssh: str) -> None:
    """GIT_SSH_COMMAND: the user's own command, given the timeouts. GIT_SSH: a program of
    the user's that may take no options: none are added, and only ending git's whole
    session keeps its ssh from outliving it."""
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "A = 1\n"})
    folder = tmp_path / "alice"
    folder.mkdir()
    (folder / ".snapver").write_text(toml_dumps({
        "store": {"path": "snapshots", "remote": f"ssh://root@127.0.0.1:{stalled_port}/team.git"},
        "nodes": {"ct200": local_node(site)}}))
    here = Path.cwd()
    os.chdir(folder)
    try:
        assert run_inproc("init", "--writer", "alice@lab").code == 0
    finally:
        os.chdir(here)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "SNAPVER_GIT_TIMEOUT": str(GIT_TIMEOUT)}
    if user_ssh == "GIT_SSH_COMMAND":
        env["GIT_SSH_COMMAND"] = "ssh -o BatchMode=yes -o LogLevel=ERROR"
    else:
        program = tmp_path / "my-ssh"
        program.write_text('#!/bin/sh\nexec ssh -o BatchMode=yes -o LogLevel=ERROR "$@"\n')
        program.chmod(0o755)
        env.update(GIT_SSH=str(program), GIT_SSH_VARIANT="ssh")
    began = time.monotonic()
    process = subprocess.Popen([sys.executable, "-m", "snapver", "--config", str(folder / ".snapver"), "sync"],
                               stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    seen: dict[int, str] = {}
    while process.poll() is None and time.monotonic() - began < 60:
        seen.update(ssh_processes(stalled_port))
        time.sleep(0.05)
    out, err = process.communicate(timeout=60 - (time.monotonic() - began))
    assert process.returncode == 3, (out, err)
    assert err.decode().startswith("snapver: error: ") and b"Traceback" not in err, err
    deadline = time.monotonic() + 5
    while ssh_processes(stalled_port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ssh_processes(stalled_port) == {}, "an ssh child of git outlived `snapver sync`"
    assert seen, "git never started ssh"
    for command in seen.values():
        assert "BatchMode=yes" in command, command  # the user's command, not replaced
        if user_ssh == "GIT_SSH_COMMAND":
            assert "ConnectTimeout=" in command and "ServerAliveInterval=" in command, command
