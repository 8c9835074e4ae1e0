"""A push into a container lands in its writable layer: which container and image each
snapshot and push record saw, status when the container was re-created, the plan's warning.

The ids are checked against `docker inspect`, the files inside the container with its own
tools; the re-creation is a real `docker rm -f` + `docker run` of the same name and image."""

from __future__ import annotations

import json
from pathlib import Path

import dockerkit
from storyline import FILE, write_patch

LAYER_LINE = "lives in the container's writable layer"


def _ids(name: str) -> dict[str, str]:
    container, image = dockerkit.docker("inspect", "--format", "{{.Id}} {{.Image}}", name).stdout.decode().split()
    return {"id": container, "image": image}


def _recreate(name: str, image: str, site_packages: Path) -> None:
    """`docker rm -f` + `docker run` under the same name from the same image (a pod restart)."""
    dockerkit.remove_container(name)
    dockerkit.docker("run", "-d", "--network", "none", "--name", name, image, "sh", "-c", dockerkit.MAIN)
    dockerkit.copy_sglang_in(name, site_packages)


def _notes(run_snapver, node: str) -> list[str]:
    result = run_snapver("status", node, "--json")
    assert result.code in (0, 1) and "Traceback" not in result.err, result
    (row,) = json.loads(result.out)["nodes"]
    return row["notes"]


def test_pull_records_the_container_and_image_ids(sglang_container, container_node, write_config,
                                                  run_snapver) -> None:
    write_config({"box": container_node(sglang_container)})
    assert run_snapver("pull", "box").code == 0
    result = run_snapver("show", "box", "--json")
    assert result.code == 0, result
    recorded = json.loads(result.out)["meta"]["container"]
    expected = _ids(sglang_container)
    assert {k: recorded[k] for k in ("id", "image")} == expected, recorded
    assert recorded["name"] == sglang_container and recorded["engine"] == "docker", recorded
    result = run_snapver("show", "box")
    assert result.code == 0, result
    line = next(line for line in result.out.splitlines() if line.startswith("container:"))
    assert expected["id"][:12] in line and expected["image"].removeprefix("sha256:")[:12] in line, result.out


def test_an_exec_node_says_its_ids_are_not_known(sglang_container, write_config, run_snapver) -> None:
    """Through an exec prefix (kubectl's stand-in here) the runtime is not snapver's to ask."""
    write_config({"pod0": {"exec": ["docker", "exec", "-i", sglang_container],
                           "site_packages": dockerkit.SGLANG_PYTHON}})
    assert run_snapver("pull", "pod0").code == 0
    result = run_snapver("show", "pod0", "--json")
    assert json.loads(result.out)["meta"]["container"] == {"exec": "docker", "id": None, "image": None}, result.out
    result = run_snapver("show", "pod0")
    assert "container:     not known (reached through exec docker" in result.out, result.out


def test_recreated_container_status_says_the_patch_is_gone(make_container, docker_image, container_node,
                                                           write_config, run_snapver, sglang_site_template,
                                                           tmp_path: Path) -> None:
    name = make_container("recreate")
    write_config({"box": container_node(name)})
    assert run_snapver("pull", "box").code == 0
    diff_file = tmp_path / "fix.diff"
    patched = write_patch(sglang_site_template, FILE, diff_file)
    assert run_snapver("patch", "import", "fix", str(diff_file), "--base", "box", "--nodes", "box").code == 0

    # The plan says once where the change lives, and how to make it last.
    result = run_snapver("push", "fix", "--dry-run")
    assert result.code == 0, result
    said = result.out + result.err
    assert said.count(LAYER_LINE) == 1 and "snapver patch export fix" in said, said
    result = run_snapver("push", "fix", "--yes")
    assert result.code == 0, result
    assert (result.out + result.err).count(LAYER_LINE) == 1, result
    before = _ids(name)
    result = run_snapver("status", "box", "--json")
    (row,) = json.loads(result.out)["nodes"]
    assert {k: row["push"]["container"][k] for k in ("id", "image")} == before, row["push"]
    assert not [n for n in row["notes"] if "re-created" in n], row["notes"]

    _recreate(name, docker_image, sglang_site_template)
    assert _ids(name)["id"] != before["id"]
    image12 = before["image"].removeprefix("sha256:")[:12]
    assert _notes(run_snapver, "box") == [
        f"container re-created from image sha256:{image12} since the push of fix: the patch is gone"]
    result = run_snapver("status", "box")
    assert f"box: container re-created from image sha256:{image12} since the push of fix" in result.out, result

    # The files brought back by hand (the image rebuilt with the patch): they still hold it.
    (tmp_path / "patched.py").write_bytes(patched)
    dockerkit.docker("cp", str(tmp_path / "patched.py"), f"{name}:{dockerkit.SGLANG_PYTHON}/{FILE}")
    assert _notes(run_snapver, "box") == ["container re-created since the push of fix (the files still hold it)"]
