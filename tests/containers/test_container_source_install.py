"""A container laid out as the official SGLang image: sglang is an editable install of a git
checkout at /sgl-workspace/sglang (tagged v0.5.23), with only its .pth and dist-info in
/usr/local/lib/python3.11/dist-packages. The node names no site_packages: the container's
Python says where sglang is, and known-good is the checkout's HEAD. One container for the
module; results are checked inside it with its own git and tools.
"""

from __future__ import annotations

import json
import time
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
    result = run_snapver("show", "ct201")
    shown = "install:       editable at /sgl-workspace/sglang/python (checkout /sgl-workspace/sglang)"
    assert shown in result.out, result

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


def _restore(name: str, rel: str, data: bytes, tmp_path: Path) -> None:
    """Put ``data`` back at ``rel`` in the checkout, by hand (docker cp), as it was committed."""
    (tmp_path / "restore.py").write_bytes(data)
    dockerkit.docker("cp", str(tmp_path / "restore.py"), f"{name}:{dockerkit.SGLANG_PYTHON}/{rel}")


def _ps_flags(run_snapver, node: str) -> tuple[int, list[dict]]:
    """ps's exit code and the container's processes that import sglang (started by the test)."""
    result = run_snapver("ps", node, "--json")
    assert result.out and "Traceback" not in result.err, result
    processes = [p for n in json.loads(result.out)["nodes"] for p in n["processes"]]
    return result.code, [p for p in processes if IMPORTER_TAG in p["command"]]


IMPORTER_TAG = "snapver-test-importer"  # in the importer's command line, to find it in ps
READY = "/tmp/importer-ready"


def test_a_captured_hotfix_pushed_and_rolled_back_in_the_checkout(official, write_config, run_snapver,
                                                                   tmp_path: Path) -> None:
    """Capture a hot-fix made inside the container, push it as a patch, roll it back: the
    committed bytes again; status names the patch against the tag, then pristine; ps flags a
    python that imported the tree (started from /, as a server is) after the push only."""
    write_config({"ct201": {"container": official}})
    commit = in_container(official, "git -C /sgl-workspace/sglang rev-parse HEAD").strip()
    known_good = f"git {TAG} ({commit[:7]})"
    target = f"{dockerkit.SGLANG_PYTHON}/{HOTFIX}"
    committed = dockerkit.docker("exec", official, "git", "-C", "/sgl-workspace/sglang", "show",
                                 f"HEAD:python/{HOTFIX}").stdout
    assert dockerkit.docker("exec", official, "cat", target).stdout == committed

    assert run_snapver("pull", "ct201").code == 0
    in_container(official, f"echo '# hot-fix' >> {target}")
    hot = dockerkit.docker("exec", official, "cat", target).stdout
    result = run_snapver("patch", "capture", "hot", "ct201", "--base", "ct201")
    assert result.code == 0, result
    result = run_snapver("patch", "export", "hot")
    assert result.code == 0 and "+# hot-fix" in result.out and HOTFIX in result.out, result
    _restore(official, HOTFIX, committed, tmp_path)  # the hot-fix undone by hand

    dockerkit.docker("exec", "-d", "-w", "/", "-e", "PYTHONDONTWRITEBYTECODE=1", official, "python3", "-c",
                     f"import sglang.srt, time; open({READY!r}, 'w').close(); time.sleep(300)  # {IMPORTER_TAG}")
    try:
        deadline = time.monotonic() + 30
        while in_container(official, f"ls {READY} 2>/dev/null; true").strip() != READY:
            assert time.monotonic() < deadline, "the importer never imported sglang.srt"
            time.sleep(0.1)
        _, importers = _ps_flags(run_snapver, "ct201")  # (the container's main python may be flagged)
        assert len(importers) == 1 and not importers[0]["restart_needed"], importers

        result = run_snapver("push", "hot", "ct201", "--yes")
        assert result.code == 0, result
        assert dockerkit.docker("exec", official, "cat", target).stdout == hot
        code, row = status_row(run_snapver, "ct201")
        assert row["known_good"]["name"] == known_good, row
        files = [(f["path"], f["status"], f["label"], f["patches"]) for f in row["known_good"]["files"]]
        assert files == [(HOTFIX, "M", "patch", ["hot"])], row
        result = run_snapver("status", "ct201")
        assert f"M  {HOTFIX}  patch hot" in result.out and known_good in result.out, result
        code, importers = _ps_flags(run_snapver, "ct201")
        assert code == 1 and len(importers) == 1 and importers[0]["restart_needed"], importers

        result = run_snapver("rollback", "ct201", "--yes")
        assert result.code == 0, result
        assert dockerkit.docker("exec", official, "cat", target).stdout == committed
        code, row = status_row(run_snapver, "ct201")
        assert code == 0 and row["known_good"]["name"] == known_good and row["known_good"]["files"] == [], row
        _, importers = _ps_flags(run_snapver, "ct201")
        assert len(importers) == 1 and not importers[0]["restart_needed"], importers
        assert in_container(official, "git --no-optional-locks -C /sgl-workspace/sglang status --porcelain") == ""
    finally:
        in_container(official, f"pkill -f {IMPORTER_TAG}; rm -f {READY} {MARKER}; true")


# A hand edit inside the container: waits for the push to stage a file in the folder, then
# appends to the file named (a second process, inside the container, racing the push).
HAND_EDIT = r"""
import os, sys, time
folder, target = sys.argv[1], sys.argv[2]
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    if any(name.startswith(".snapver-") for name in os.listdir(folder)):
        with open(target, "a") as handle:
            handle.write("# hand edit during the push\n")
        open("/tmp/hand-edit-done", "w").close()
        sys.exit(0)
    time.sleep(0.001)
sys.exit(1)
"""
SECOND = "sglang/srt/utils/aiter.py"  # sorts before HOTFIX: the push stages it first


def test_a_hand_edit_in_the_container_during_a_push_is_never_erased(official, write_config, run_snapver,
                                                                    tmp_path: Path) -> None:
    write_config({"ct201": {"container": official}})
    assert run_snapver("pull", "ct201").code == 0
    made = run_snapver("patch", "new", "two", "--base", "ct201", "--nodes", "ct201")
    assert made.code == 0, made
    folder = Path(made.out.strip().splitlines()[-1])
    for rel in (SECOND, HOTFIX):
        (folder / rel).write_bytes((folder / rel).read_bytes() + b"# patched\n")
    assert run_snapver("patch", "save", "two").code == 0
    before = {rel: dockerkit.docker("exec", official, "cat", f"{dockerkit.SGLANG_PYTHON}/{rel}").stdout
              for rel in (SECOND, HOTFIX)}
    utils = f"{dockerkit.SGLANG_PYTHON}/sglang/srt/utils"
    dockerkit.docker("exec", "-d", official, "python3", "-c", HAND_EDIT, utils, f"{dockerkit.SGLANG_PYTHON}/{HOTFIX}")
    try:
        # The push holds 3 s after its first file is staged: the hand edit lands then.
        result = run_snapver("push", "two", "ct201", "--yes",
                             env={"SNAPVER_TEST_PAUSE_AFTER_FILES": "1", "SNAPVER_TEST_PAUSE_SECONDS": "3"})
        assert in_container(official, "ls /tmp/hand-edit-done 2>/dev/null; true").strip(), "no hand edit was made"
        assert result.code == 1, result
        assert "changed while the push was writing" in result.err and HOTFIX in result.err, result
        now = {rel: dockerkit.docker("exec", official, "cat", f"{dockerkit.SGLANG_PYTHON}/{rel}").stdout
               for rel in (SECOND, HOTFIX)}
        assert now == {SECOND: before[SECOND], HOTFIX: before[HOTFIX] + b"# hand edit during the push\n"}, now
        leftovers = in_container(official, f"find {dockerkit.SGLANG_PYTHON} -name '.snapver-*'")
        assert leftovers == "", leftovers
    finally:
        _restore(official, HOTFIX, before[HOTFIX], tmp_path)
        in_container(official, "rm -f /tmp/hand-edit-done")


def test_the_official_layout_on_an_ssh_host_is_held_against_its_tag(official, ssh_node, write_config,
                                                                    run_snapver) -> None:
    """The same container reached through the SSH host's docker, with no site_packages."""
    node = ssh_node("ct200", "", container=official)
    del node["site_packages"]
    write_config({"ct200": node})
    commit = in_container(official, "git -C /sgl-workspace/sglang rev-parse HEAD").strip()
    assert run_snapver("pull", "ct200").code == 0
    code, row = status_row(run_snapver, "ct200")
    assert code == 0 and row["known_good"]["name"] == f"git {TAG} ({commit[:7]})", row
    assert row["known_good"]["files"] == [] and row["drift"] == [], row
    result = run_snapver("status", "ct200")
    assert f"git {TAG} ({commit[:7]})  pristine" in result.out, result
