"""A node in a Docker container on this machine: every verb through `docker exec -i`."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import dockerkit
from storyline import FILE, container_sha256, story, write_patch


def test_local_container_pull_hotfix_capture_push_ps_rollback(sglang_container, container_node, write_config,
                                                              run_snapver, sglang_site_template, tmp_path) -> None:
    write_config({"box": container_node(sglang_container)})
    story(run_snapver, sglang_container, "box", sglang_site_template, tmp_path)


def test_exec_prefix_stands_in_for_kubectl(sglang_container, write_config, run_snapver, isolated_env) -> None:
    """``exec`` is the way into a pod (kubectl exec -i POD -- ...); no cluster here, so
    `docker exec -i NAME` stands in for kubectl: the same argv shape, stdin passed through."""
    write_config({"pod0": {"exec": ["docker", "exec", "-i", sglang_container],
                           "site_packages": dockerkit.SGLANG_PYTHON}})
    result = run_snapver("pull", "pod0", "--json")
    assert result.code == 0, result
    result = run_snapver("show", "pod0", FILE)
    assert result.code == 0, result
    assert dockerkit.docker("exec", sglang_container, "cat", f"{dockerkit.SGLANG_PYTHON}/{FILE}").stdout \
        == result.out.encode()
    result = run_snapver("verify", "pod0")
    assert "pod0" in result.out + result.err and "Traceback" not in result.err, result
    result = run_snapver("nodes", "--check", "--json")
    assert result.code == 0, result
    (row,) = json.loads(result.out)["nodes"]
    assert row["reachable"] and row["site_packages"] == dockerkit.SGLANG_PYTHON, row


def test_restart_runs_on_the_host_and_health_url_is_polled_inside(make_container, container_node, write_config,
                                                                  run_snapver, sglang_site_template,
                                                                  tmp_path: Path) -> None:
    """`docker restart NAME` only works on the host (no docker in the container); the
    health URL answers only inside the container (--network none): both succeed, and the
    container really restarted (its main process is new)."""
    name = make_container("restart")
    marker = tmp_path / "restarted-on-the-host"
    write_config({"box": container_node(name, restart=f"docker restart -t 1 {name} && touch {marker}",
                                        health_url="http://127.0.0.1:8000/", health_timeout=60)})
    started = dockerkit.docker("inspect", "--format", "{{.State.StartedAt}}", name).stdout
    assert run_snapver("pull", "box").code == 0
    diff_file = tmp_path / "fix.diff"
    patched = write_patch(sglang_site_template, FILE, diff_file)
    assert run_snapver("patch", "import", "fix", str(diff_file), "--base", "box", "--nodes", "box").code == 0
    result = run_snapver("push", "fix", "--yes")
    assert result.code == 0, result
    assert marker.exists(), result
    assert dockerkit.docker("inspect", "--format", "{{.State.StartedAt}}", name).stdout != started
    assert dockerkit.docker("exec", name, "cat", f"{dockerkit.SGLANG_PYTHON}/{FILE}").stdout == patched
    assert "restarted" in result.out + result.err, result
    result = run_snapver("rollback", "box", "--yes")
    assert result.code == 0, result
    assert container_sha256(name, FILE) != hashlib.sha256(patched).hexdigest()


def test_container_and_image_ids_from_the_engine_on_the_host(sglang_container) -> None:
    """What a push record will keep to tell a re-created container (asked of the host's engine)."""
    from snapver.config import NodeSpec
    from snapver.transport.container import LocalContainerTransport

    spec = NodeSpec("box", dockerkit.SGLANG_PYTHON, local=True, container=sglang_container)
    expected = dockerkit.docker("inspect", "--format", "{{.Id}} {{.Image}}", sglang_container).stdout.split()
    assert LocalContainerTransport(spec).container_identity() == tuple(word.decode() for word in expected)
    gone = NodeSpec("box", dockerkit.SGLANG_PYTHON, local=True, container="snapver-test-no-such-container")
    assert LocalContainerTransport(gone).container_identity() is None
