"""A container laid out as the official SGLang image: sglang is an editable install of a git
checkout at /sgl-workspace/sglang (tagged v0.5.23), with only its .pth and dist-info in
/usr/local/lib/python3.11/dist-packages. The node names no site_packages: the container's
Python says where sglang is, and known-good is the checkout's HEAD. One container for the
module; results are checked inside it with its own git and tools.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import dockerkit
import pytest
from editable import TAG, VERSION, build_checkout, install_editable

HOTFIX = "sglang/srt/utils/auth.py"
DIST_PACKAGES = "/usr/local/lib/python3.11/dist-packages"
MARKER = "/tmp/sglang-was-imported"  # sglang/__init__.py writes it when imported
GIT_STATE = "find /sgl-workspace/sglang/.git -printf '%p %s %T@\\n' | sort | sha256sum"  # what git holds, as stat says


@pytest.fixture(scope="module")
def official(docker_image: str, sglang_site_template: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running container with the official image's layout; its name."""
    build = tmp_path_factory.mktemp("official-layout")
    build_checkout(sglang_site_template, build / "sgl-workspace", MARKER)
    install_editable(build / "dist-packages", dockerkit.SGLANG_PYTHON)
    name = dockerkit.run_container(docker_image, "editable")
    try:
        dockerkit.exec_in(name, f"mkdir -p /sgl-workspace {DIST_PACKAGES}")
        dockerkit.docker("cp", str(build / "sgl-workspace" / "sglang"), f"{name}:/sgl-workspace/sglang")
        dockerkit.docker("cp", f"{build / 'dist-packages'}/.", f"{name}:{DIST_PACKAGES}/")
        yield name
    finally:
        dockerkit.remove_container(name)


def in_container(name: str, script: str) -> str:
    return dockerkit.exec_in(name, script).stdout.decode()


def status_row(run_snapver, node: str) -> tuple[int, dict]:
    result = run_snapver("status", node, "--json")
    assert result.out, result
    return result.code, json.loads(result.out)["nodes"][0]


def test_an_editable_checkout_in_a_container_is_held_against_its_tag(official, write_config, run_snapver) -> None:
    write_config({"ct201": {"container": official}})
    commit = in_container(official, "git -C /sgl-workspace/sglang rev-parse HEAD").strip()
    known_good = f"git {TAG} ({commit[:7]})"
    git_before = in_container(official, GIT_STATE)

    result = run_snapver("nodes", "--check", "--json")
    assert result.code == 0, result
    (row,) = json.loads(result.out)["nodes"]
    assert row["site_packages"] == dockerkit.SGLANG_PYTHON, row
    assert row["dists"] == f"sglang {VERSION} (editable at {dockerkit.SGLANG_PYTHON}, git {TAG} {commit[:7]})", row

    assert run_snapver("pull", "ct201").code == 0
    in_container(official, f"echo '# hot-fix' >> {dockerkit.SGLANG_PYTHON}/{HOTFIX}")
    for pulled_since in (False, True):  # the label holds whether or not a pull recorded the edit
        if pulled_since:
            assert run_snapver("pull", "ct201").code == 0
        code, row = status_row(run_snapver, "ct201")
        assert code == 1 and row["known_good"]["name"] == known_good, row
        assert [(f["path"], f["status"], f["label"]) for f in row["known_good"]["files"]] == [(HOTFIX, "M", "hot-fix")]
        assert row["drift"] == ([] if pulled_since else [{"path": HOTFIX, "status": "M", "label": "hot-fix",
                                                          "patches": []}]), row
    result = run_snapver("status", "ct201")
    assert known_good in result.out, result

    result = run_snapver("verify", "ct201")
    assert result.code == 1, result
    assert f"M\t{HOTFIX}" in result.out and f"against {known_good}" in result.out, result
    result = run_snapver("log", "ct201")
    assert f"sglang {VERSION}" in result.out, result

    # Nothing ran sglang's __init__, and git wrote nothing (no index refresh, no lock).
    assert in_container(official, f"ls {MARKER} 2>/dev/null; true") == ""
    assert in_container(official, GIT_STATE) == git_before
    in_container(official, f"sed -i '$ d' {dockerkit.SGLANG_PYTHON}/{HOTFIX}")
    code, row = status_row(run_snapver, "ct201")
    assert row["known_good"]["files"] == [], row


def test_without_git_in_the_container_a_note_says_so_and_known_good_falls_back(official, write_config,
                                                                              run_snapver) -> None:
    write_config({"ct201": {"container": official}})
    git = in_container(official, "command -v git").strip()
    in_container(official, f"mv {git} {git}.away")
    try:
        code, row = status_row(run_snapver, "ct201")
        assert code == 1 and row["known_good"] is None, row
        assert any("no git on the node" in note and "/sgl-workspace/sglang" in note for note in row["notes"]), row
        assert row["pristine_unchecked"], row
        result = run_snapver("status", "ct201")
        assert "ct201: no git on the node" in result.out, result
        result = run_snapver("verify", "ct201")
        assert result.code == 3 and "no git on the node" in result.err and "Traceback" not in result.err, result
    finally:
        in_container(official, f"mv {git}.away {git}")
