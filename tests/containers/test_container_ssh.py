"""A node in a Docker container on an SSH host: the real sshd on loopback runs `docker
exec` on this same machine, so the container is reached through the host's shell."""

from __future__ import annotations

import json

import dockerkit
from storyline import story


def test_container_on_an_ssh_host_every_verb(sglang_container, ssh_node, write_config, run_snapver,
                                              sglang_site_template, tmp_path) -> None:
    node = ssh_node("ct200", dockerkit.SGLANG_PYTHON, container=sglang_container)
    write_config({"ct200": node})
    story(run_snapver, sglang_container, "ct200", sglang_site_template, tmp_path)


def test_container_on_an_ssh_host_through_the_persistent_connection(sglang_container, ssh_node, write_config,
                                                                    run_snapver, tmp_path) -> None:
    write_config({"ct129": ssh_node("ct129", dockerkit.SGLANG_PYTHON, container=sglang_container,
                                    control_persist=30)})
    for _ in range(2):  # the second through the mux the first started
        result = run_snapver("pull", "ct129")
        assert result.code == 0, result
    # The container's ids, asked of docker on the SSH host, are in the snapshot.
    result = run_snapver("show", "ct129", "--json")
    recorded = json.loads(result.out)["meta"]["container"]
    expected = dockerkit.docker("inspect", "--format", "{{.Id}} {{.Image}}", sglang_container).stdout.decode()
    assert f"{recorded['id']} {recorded['image']}" == expected.strip(), recorded


def test_stopped_container_on_an_ssh_host(make_container, ssh_node, write_config, run_snapver, isolated_env) -> None:
    name = make_container("ssh-stopped", sglang=False)
    dockerkit.docker("stop", "-t", "0", name)
    write_config({"ct200": ssh_node("ct200", dockerkit.SGLANG_PYTHON, container=name)})
    result = run_snapver("pull", "ct200")
    assert result.code == 3, result
    first = result.err.splitlines()[0]
    assert first == f"snapver: error: ct200: container {name} is not running on 127.0.0.200", result
    assert "Traceback" not in result.err


def test_exec_tool_missing_on_the_ssh_host(ssh_node, write_config, run_snapver) -> None:
    write_config({"ct200": ssh_node("ct200", dockerkit.SGLANG_PYTHON,
                                    exec=["/nonexistent/kubectl", "exec", "-i", "sglang-0", "--"])})
    result = run_snapver("pull", "ct200")
    assert result.code == 3, result
    assert result.err.splitlines()[0] == "snapver: error: ct200: /nonexistent/kubectl not found on 127.0.0.200", result
