"""Bytes a node prints before the agent starts (a login banner, a `.bashrc` echo, a
printing `sitecustomize`) are never read as the agent's frames: the agent greets first,
and anything else is refused with exit 3 within the node's `connect_timeout`.

The SSH cases run a second real sshd on its own loopback address whose `ForceCommand`
prints a banner and then runs the command asked for, as a login wrapper does.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import Sshd

SRT = "sglang/srt"
BANNER_ADDRESS = "127.0.0.201"
HUNG_ADDRESS = "127.0.0.202"
BANNER = "Welcome to ct200! Authorized use only."
CONNECT_TIMEOUT = 5  # the agent's start is given at least AGENT_START_MIN (5 s)
# What start-up (Python, imports) may add on a busy 2-core machine beyond the deadline.
SLACK = 15


def _wrapper_sshd(sshd: Sshd, folder: Path, address: str, force_command: str) -> subprocess.Popen[bytes]:
    """An sshd on ``address`` (the session sshd's port, keys and users) running every
    command through ``force_command``."""
    config = folder / f"sshd_config.{address}"
    config.write_text(
        f"Port {sshd.port}\nListenAddress {address}\n"
        f"HostKey {sshd.dir / 'host_ed25519'}\nPidFile {folder / f'sshd.{address}.pid'}\n"
        f"AuthorizedKeysFile {sshd.dir / 'authorized_keys'}\n"
        "StrictModes no\nUsePAM no\nPubkeyAuthentication yes\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nPermitRootLogin prohibit-password\nPermitUserRC no\n"
        "LogLevel ERROR\nUseDNS no\nPrintMotd no\nPrintLastLog no\n"
        f"ForceCommand {force_command}\n")
    process = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pid_file = folder / f"sshd.{address}.pid"
    deadline = time.monotonic() + 10
    while not pid_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the wrapper sshd on {address} did not start")
        time.sleep(0.02)
    return process


@pytest.fixture(scope="module")
def wrapper_sshds(sshd: Sshd, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two sshds: one prints BANNER before every command, one hangs before it (a
    wrapper waiting on something). Returns a known_hosts file for both."""
    folder = tmp_path_factory.mktemp("wrapper-sshd")
    processes = [
        _wrapper_sshd(sshd, folder, BANNER_ADDRESS, f'echo "{BANNER}"; eval "$SSH_ORIGINAL_COMMAND"'),
        _wrapper_sshd(sshd, folder, HUNG_ADDRESS, 'sleep 600; eval "$SSH_ORIGINAL_COMMAND"'),
    ]
    known_hosts = folder / "known_hosts"
    known_hosts.write_text("".join(f"[{address}]:{sshd.port} {sshd.host_public_key}\n"
                                   for address in (BANNER_ADDRESS, HUNG_ADDRESS)))
    try:
        yield known_hosts
    finally:
        for process in processes:
            process.terminate()
            process.wait(timeout=10)


@pytest.fixture
def site(make_site_packages) -> Path:
    return make_site_packages("n", files={f"{SRT}/a.py": "A = 1\n"})


def wrapped_node(ssh_node, site: Path, known_hosts: Path, address: str, **extra) -> dict:
    return ssh_node("ct200", site, host=address, known_hosts=str(known_hosts), connect_timeout=CONNECT_TIMEOUT,
                    **extra)


def assert_refused_in_time(run_snapver, args: list[str], want: list[str]) -> None:
    began = time.monotonic()
    result = run_snapver(*args, timeout=CONNECT_TIMEOUT + SLACK + 5)
    elapsed = time.monotonic() - began
    assert result.code == 3, str(result)
    assert "Traceback" not in result.err and "snapver: error: ct200: " in result.err, str(result)
    for text in want:
        assert text in result.err, str(result)
    assert elapsed < CONNECT_TIMEOUT + SLACK, f"took {elapsed:.1f} s"


@pytest.mark.parametrize("args", [["pull", "ct200"], ["nodes", "--check"]], ids=["pull", "nodes-check"])
def test_a_login_banner_before_the_agent_is_refused(wrapper_sshds, site, ssh_node, write_config, run_snapver,
                                                    args: list[str]) -> None:
    write_config({"ct200": wrapped_node(ssh_node, site, wrapper_sshds, BANNER_ADDRESS)})
    assert_refused_in_time(run_snapver, args, ["printed", "Welcome to ct200", "before the agent", "login banner"])


def test_a_login_banner_is_refused_through_a_persistent_connection(wrapper_sshds, site, ssh_node, write_config,
                                                                   run_snapver) -> None:
    write_config({"ct200": wrapped_node(ssh_node, site, wrapper_sshds, BANNER_ADDRESS, control_persist=5)})
    assert_refused_in_time(run_snapver, ["pull", "ct200"], ["printed", "Welcome to ct200", "before the agent"])


def test_a_node_that_never_starts_the_agent_fails_within_connect_timeout(wrapper_sshds, site, ssh_node,
                                                                          write_config, run_snapver) -> None:
    write_config({"ct200": wrapped_node(ssh_node, site, wrapper_sshds, HUNG_ADDRESS)})
    assert_refused_in_time(run_snapver, ["pull", "ct200"], [f"did not start within {CONNECT_TIMEOUT} s"])


def test_a_printing_sitecustomize_on_a_local_node_is_refused(site, tmp_path, write_config, run_snapver) -> None:
    """A ``sitecustomize`` that prints, unbuffered, in the node's Python (no ``-S``: the
    node has a ``python`` and no ``site_packages``)."""
    custom = tmp_path / "custom"
    custom.mkdir()
    (custom / "sitecustomize.py").write_text("print('sitecustomize: GPU 0-7 ready')\n")
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONUNBUFFERED=1 PYTHONPATH={custom} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    write_config({"ct200": {"local": True, "python": str(python), "paths": [SRT], "connect_timeout": CONNECT_TIMEOUT}})
    assert_refused_in_time(run_snapver, ["pull", "ct200"], ["printed", "sitecustomize: GPU 0-7 ready"])
