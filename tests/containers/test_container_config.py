"""`.snapver` keys of a node in a container: container, engine, exec; refusals name file and key."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapver.config import load_config
from snapver.errors import ConfigError

SP = "/sgl-workspace/sglang/python"


def test_container_on_a_host_runs_there(write_config) -> None:
    path = write_config({"ct201": {"host": "10.1.2.201", "container": "sglang", "site_packages": SP}})
    node = load_config(str(path)).node("ct201")
    assert (node.container, node.engine, node.exec_prefix, node.local) == ("sglang", "docker", (), False)
    assert node.in_container
    assert node.address == "10.1.2.201 docker:sglang"


def test_container_without_host_is_on_this_machine(write_config) -> None:
    """No ``host``: the engine runs here, as with ``local = true`` (SPEC: "run here, or on host")."""
    path = write_config({"box": {"container": "sglang", "engine": "podman", "site_packages": SP},
                         "box2": {"local": True, "container": "sglang", "site_packages": SP}})
    config = load_config(str(path))
    for name in ("box", "box2"):
        node = config.node(name)
        assert node.local and node.engine == "podman" if name == "box" else node.engine == "docker"
        assert node.address.startswith("local ")


def test_paths_in_a_local_container_are_the_containers(write_config, tmp_path: Path) -> None:
    """A local node's relative paths are made absolute against the config's folder; a
    container's paths are inside the container, taken as they are."""
    path = write_config({"box": {"container": "sglang", "site_packages": "sp", "python": "bin/python3"}},
                        where=tmp_path / "proj")
    node = load_config(str(path)).node("box")
    assert (node.site_packages, node.python) == ("sp", "bin/python3")


def test_exec_prefix(write_config) -> None:
    prefix = ["kubectl", "exec", "-i", "-n", "infer", "sglang-0", "-c", "sglang", "--"]
    path = write_config({"pod0": {"exec": prefix, "python": "python3"},
                         "far": {"host": "10.0.0.9", "exec": ["nsenter", "-t", "1", "-m", "--"], "python": "python3"}})
    config = load_config(str(path))
    assert config.node("pod0").exec_prefix == tuple(prefix) and config.node("pod0").local
    assert config.node("pod0").container is None and config.node("pod0").in_container
    assert config.node("far").exec_prefix[0] == "nsenter" and not config.node("far").local
    assert config.node("pod0").address.startswith("local exec kubectl exec -i")


def test_a_container_shared_by_defaults_yields_to_a_nodes_own_exec(write_config) -> None:
    path = write_config({"a": {"host": "10.0.0.1"}, "pod": {"exec": ["kubectl", "exec", "-i", "p", "--"]}},
                        defaults={"container": "sglang", "engine": "podman", "site_packages": SP})
    config = load_config(str(path))
    assert (config.node("a").container, config.node("a").engine) == ("sglang", "podman")
    assert (config.node("pod").container, config.node("pod").exec_prefix[0]) == (None, "kubectl")


def test_a_plain_node_is_not_in_a_container(write_config) -> None:
    path = write_config({"n": {"host": "10.0.0.1", "site_packages": "/sp"}})
    node = load_config(str(path)).node("n")
    assert not node.in_container and node.container is None and node.exec_prefix == ()
    assert node.address == "10.0.0.1"


BAD = [
    ("container-and-exec", {"n": {"container": "c", "exec": ["kubectl", "--"], "site_packages": SP}},
     None, "nodes.n", "container and exec"),
    ("container-not-string", {"n": {"container": 3, "site_packages": SP}}, None, "nodes.n.container", "a string"),
    ("container-empty", {"n": {"container": "", "site_packages": SP}}, None, "nodes.n.container", "container name"),
    ("container-option", {"n": {"container": "-e", "site_packages": SP}}, None, "nodes.n.container",
     "container name"),
    ("engine-unknown", {"n": {"container": "c", "engine": "lxc", "site_packages": SP}}, None, "nodes.n.engine",
     '"docker" or "podman"'),
    ("engine-not-string", {"n": {"container": "c", "site_packages": SP}}, {"engine": ["docker"]},
     "defaults.engine", '"docker" or "podman"'),
    ("exec-string", {"n": {"exec": "kubectl exec -i p --", "site_packages": SP}}, None, "nodes.n.exec",
     "list of strings"),
    ("exec-empty", {"n": {"exec": [], "site_packages": SP}}, None, "nodes.n.exec", "non-empty"),
    ("exec-not-strings", {"n": {"exec": ["kubectl", 3], "site_packages": SP}}, None, "nodes.n.exec",
     "list of strings"),
    ("exec-empty-command", {"n": {"exec": ["", "x"], "site_packages": SP}}, None, "nodes.n.exec", "non-empty"),
    ("exec-in-defaults", {"n": {"host": "h", "site_packages": SP}}, {"exec": ["kubectl", "--"]}, "defaults.exec",
     "set per node"),
]


@pytest.mark.parametrize(("nodes", "defaults", "key", "reason"), [case[1:] for case in BAD],
                         ids=[case[0] for case in BAD])
def test_bad_container_config(write_config, nodes, defaults, key, reason) -> None:
    path = write_config(nodes, defaults=defaults)
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert caught.value.exit_code == 2
    assert caught.value.message.startswith(f"{path}: {key}: "), caught.value.message
    assert reason in caught.value.message, caught.value.message


def test_a_node_without_site_packages_is_found_by_its_python(write_config) -> None:
    """A container, an exec prefix or an SSH host may leave site_packages and python out (the
    node's Python is asked where the package is); a local folder node may not."""
    path = write_config({"box": {"container": "sglang"}, "pod": {"exec": ["kubectl", "exec", "-i", "p", "--"]},
                         "ct201": {"host": "10.1.2.201", "container": "sglang"}, "ct200": {"host": "10.1.2.200"}})
    config = load_config(str(path))
    assert all(config.node(n).site_packages is None and config.node(n).python is None
               for n in ("box", "pod", "ct201", "ct200"))


def test_bad_container_config_is_one_line_exit_2(write_config, run_snapver) -> None:
    write_config({"n": {"container": "c", "exec": ["kubectl", "--"], "site_packages": SP}})
    result = run_snapver("nodes")
    assert result.code == 2, result
    assert "Traceback" not in result.err
    assert "container and exec" in result.err.splitlines()[0], result
