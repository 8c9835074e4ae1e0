"""A container node that cannot be reached: one line naming the node and the cause, exit 3,
a hint; nothing written to the store."""

from __future__ import annotations

import os
from pathlib import Path

import dockerkit
import pytest


def _refused(result, *words: str) -> str:
    """The error line, checked: exit 3, one `snapver: error:` line, a hint, no traceback."""
    assert result.code == 3, result
    lines = result.err.strip().splitlines()
    assert lines[0].startswith("snapver: error: "), result
    assert any(line.startswith("hint: ") for line in lines[1:]), result
    assert "Traceback" not in result.err and "agent ended unexpectedly" not in result.err, result
    for word in words:
        assert word in lines[0], result
    return lines[0]


def _nothing_written(store: Path) -> None:
    assert not store.exists() or not list((store / "refs").rglob("*")) or \
        not [p for p in (store / "refs").rglob("*") if p.is_file()], "a ref was written"


@pytest.fixture(scope="module")
def stopped_container(make_container) -> str:
    name = make_container("stopped")
    dockerkit.docker("stop", "-t", "0", name)
    return name


def test_stopped_container(stopped_container, container_node, write_config, run_snapver, isolated_env) -> None:
    write_config({"box": container_node(stopped_container)})
    line = _refused(run_snapver("pull", "box"), "box:", f"container {stopped_container}", "not running")
    assert "this machine" in line
    _nothing_written(isolated_env / "snapshots")


def test_unknown_container(container_node, write_config, run_snapver, isolated_env, docker_image) -> None:
    write_config({"box": container_node("snapver-test-no-such-container")})
    _refused(run_snapver("pull", "box"), "box:", "container snapver-test-no-such-container", "not found")
    _nothing_written(isolated_env / "snapshots")


def test_engine_binary_missing(write_config, run_snapver, isolated_env) -> None:
    """The kubectl of an exec prefix that is not there (a path that does not exist)."""
    write_config({"pod0": {"exec": ["/nonexistent/kubectl", "exec", "-i", "sglang-0", "--"],
                           "site_packages": dockerkit.SGLANG_PYTHON}})
    _refused(run_snapver("pull", "pod0"), "pod0:", "/nonexistent/kubectl not found on this machine")
    _nothing_written(isolated_env / "snapshots")


def test_podman_missing(write_config, run_snapver, isolated_env, container_node, sglang_container) -> None:
    """engine = "podman" on a machine with docker only: podman is not on PATH."""
    write_config({"box": container_node(sglang_container, engine="podman")})
    result = run_snapver("pull", "box", env={"PATH": "/usr/sbin:/sbin:/bin:/nonexistent"})
    _refused(result, "box:", "podman not found on this machine")


def test_no_python_in_the_container(sglang_container, write_config, run_snapver, isolated_env) -> None:
    """A container without Python: PATH emptied by the exec prefix (the image has one)."""
    write_config({"box": {"exec": ["docker", "exec", "-i", sglang_container, "env", "PATH=/nonexistent"],
                          "site_packages": dockerkit.SGLANG_PYTHON}})
    _refused(run_snapver("pull", "box"), "box:", "no Python in")
    _nothing_written(isolated_env / "snapshots")


def test_no_python_at_the_configured_path(sglang_container, container_node, write_config, run_snapver) -> None:
    write_config({"box": container_node(sglang_container, python="/opt/venv/bin/python3")})
    _refused(run_snapver("pull", "box"), "box:", "no Python at /opt/venv/bin/python3")


def test_no_docker_daemon(sglang_container, container_node, write_config, run_snapver, tmp_path) -> None:
    """The engine's daemon is not there (a socket path nothing listens on)."""
    write_config({"box": container_node(sglang_container)})
    result = run_snapver("pull", "box", env={"DOCKER_HOST": f"unix://{tmp_path}/no-daemon.sock"})
    _refused(result, "box:", "no docker daemon answers on this machine")


def test_nodes_check_says_why(stopped_container, container_node, write_config, run_snapver) -> None:
    write_config({"box": container_node(stopped_container)})
    result = run_snapver("nodes", "--check")
    assert result.code == 3, result
    assert "not running" in result.out + result.err, result
    assert os.linesep.join(result.err.splitlines()).count("Traceback") == 0
