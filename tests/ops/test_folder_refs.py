"""Any folder is a ref (issue 13, point 3), and files by name after `--` (point 5).

The story: an engineer keeps a May 22 copy of a node's ``sglang/srt`` in
``remote_sglang_snapshot/`` (the inside of srt: ``speculative/dflash_worker.py``) and
asks whether the node still holds it. Nodes are real sshd nodes holding the unpacked
sglang wheel; expected results are computed from the files themselves.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from helpers import linked_copy, rewrite, tree_hashes
from snapver_inproc import run_inproc

WORKER = "sglang/srt/speculative/dflash_worker.py"
WORKER_TEXT = "class DFlashWorker:\n    graph_bs = [1, 2, 4, 8]\n"
FIXED_TEXT = WORKER_TEXT + "    # may22: capture the cuda graph after warm-up\n"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def story(make_site_packages, sglang_site_template, ssh_node, write_config) -> dict:
    """Node ct200 (sshd) holding sglang plus the story's dflash_worker.py; the user's folder
    ``remote_sglang_snapshot/`` is a copy of its srt with that one file edited."""
    site = make_site_packages("ct200", sglang_site_template, {WORKER: WORKER_TEXT})
    config = write_config({"ct200": ssh_node("ct200", site)})
    snapshot = Path.cwd() / "remote_sglang_snapshot"
    linked_copy(site / "sglang" / "srt", snapshot)
    rewrite(snapshot / "speculative" / "dflash_worker.py", FIXED_TEXT)
    return {"site": site, "config": config, "folder": snapshot}


def test_story_folder_diffed_against_a_node_with_a_path_inside_srt(story: dict) -> None:
    result = run_inproc("diff", "./remote_sglang_snapshot", "ct200", "--", "speculative/dflash_worker.py")
    assert result.code == 1, result.err
    # The unified diff: the folder's extra line, going from the folder (a) to the node (b).
    assert result.out.startswith(f"diff --git a/{WORKER} b/{WORKER}\n")
    assert "-    # may22: capture the cuda graph after warm-up\n" in result.out
    assert result.out.count("diff --git") == 1
    # stderr says how the folder was read and which file was compared.
    assert "./remote_sglang_snapshot/ = sglang/srt/ (the inside of sglang/srt; --root to change)" in result.err
    assert f"1 file compared: {WORKER}" in result.err
    # The folder untouched elsewhere: identical to the node but for the edited file.
    whole = run_inproc("diff", "--name-status", "./remote_sglang_snapshot", "ct200")
    assert (whole.code, whole.out) == (1, f"M\t{WORKER}\n")
    # Made the same as the node: identical, exit 0.
    (story["folder"] / "speculative" / "dflash_worker.py").write_text(WORKER_TEXT)
    same = run_inproc("diff", "./remote_sglang_snapshot", "ct200", "--", "speculative/dflash_worker.py")
    assert (same.code, same.out) == (0, "")


def test_layouts_site_packages_checkout_srt_and_inside_and_root_override(story: dict, tmp_path: Path) -> None:
    site, folder = story["site"], story["folder"]
    checkout = tmp_path / "src" / "sglang"
    linked_copy(folder, checkout / "python" / "sglang" / "srt")
    holder = tmp_path / "holder"  # holds srt/..., as the sglang/ folder does
    linked_copy(folder, holder / "srt")
    cases = [(str(site), "sglang/srt/", "a site-packages", 0),
             (str(checkout), "python/sglang/srt/", "a source checkout", 1),
             (str(holder), "srt/", "a copy of sglang/", 1),
             ("./remote_sglang_snapshot", "", "the inside of sglang/srt", 1)]
    for ref, below, layout, code in cases:
        result = run_inproc("diff", "--name-status", ref, "ct200")
        assert result.code == code, (ref, result.err)
        assert result.out == ("" if code == 0 else f"M\t{WORKER}\n"), ref
        assert f"{ref}/{below} = sglang/srt/ ({layout}; --root to change)" in result.err, result.err
    # `~` is expanded; --root says where the root is instead of matching.
    home_copy = Path(os.environ["HOME"]) / "srt-copy"
    linked_copy(folder, home_copy)
    tilde = run_inproc("diff", "--name-status", "--root", "sglang/srt", "~/srt-copy", "ct200")
    assert (tilde.code, tilde.out) == (1, f"M\t{WORKER}\n"), tilde.err
    assert "~/srt-copy/ = sglang/srt/ (the inside of sglang/srt, by --root sglang/srt)" in tilde.err
    # A wrong --root is refused, naming what it expected.
    wrong = run_inproc("diff", "--root", ".", "./remote_sglang_snapshot", "ct200")
    assert wrong.code == 2 and "holds none of sglang/srt/" in wrong.err


def test_folder_against_folder_needs_no_store_and_json_names_the_mapping(story: dict, tmp_path: Path) -> None:
    other = tmp_path / "other"
    linked_copy(story["folder"], other / "srt")
    result = run_inproc("diff", "--json", "./remote_sglang_snapshot", str(other))
    assert result.code == 0, result.err
    document = json.loads(result.out)
    assert document["a"]["kind"] == "folder" and document["a"]["layout"] == "the inside of sglang/srt"
    assert document["b"]["roots"] == [{"disk": "srt", "tracked": "sglang/srt"}]
    assert not (Path.cwd() / "snapshots").exists()  # nothing written


def test_bad_folders_exit_2_naming_the_path_and_what_was_expected(story: dict, tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("x")
    empty = tmp_path / "empty"
    (empty / "docs").mkdir(parents=True)
    (empty / "docs" / "notes.txt").write_text("no python here\n")
    cases = [("./no-such-folder", "no such folder: ./no-such-folder (expected a folder holding sglang/srt/"),
             (str(tmp_path / "a-file"), f"{tmp_path / 'a-file'} is not a folder (expected a folder holding"),
             (str(empty), f"folder {empty} holds none of the tracked paths: looked for sglang/srt/, srt/, "
                          "python/sglang/srt/ or the inside of sglang/srt")]
    for ref, message in cases:
        result = run_inproc("diff", ref, "ct200")
        assert result.code == 2, (ref, result.out, result.err)
        assert message in result.err, result.err
        assert result.err.count("snapver: error:") == 1 and "Traceback" not in result.err
    # Where only a snapshot fits, a folder is refused with the way to record it.
    assert run_inproc("pull", "ct200").code == 0
    tag = run_inproc("tag", "v1", "./remote_sglang_snapshot")
    assert tag.code == 2 and "is a folder (a live tree); only a snapshot fits here" in tag.err
    # A folder named without a slash is not a ref, but the error says how to name it.
    bare = run_inproc("diff", "remote_sglang_snapshot", "ct200")
    assert bare.code == 2 and "say ./remote_sglang_snapshot" in bare.err


def test_unreadable_folder_is_a_ref_error() -> None:
    """As a user who cannot read the folder. Root reads everything, so the check runs as
    nobody, in the system Python (the test's own lives under /root, which nobody cannot
    enter); the folder-ref code needs only the standard library."""
    shared = Path(tempfile.mkdtemp(prefix="snapver-unreadable-"))
    try:
        shared.chmod(0o755)
        locked = shared / "locked"
        (locked / "srt").mkdir(parents=True)
        locked.chmod(0o700)  # root's own: nobody may not enter it
        code = ("import sys; from pathlib import Path\n"
                "from snapver.config import Config\n"
                "from snapver.errors import RefError\n"
                "from snapver.folders import resolve_folder\n"
                "try:\n"
                "    resolve_folder(sys.argv[1], Config(None, Path('/nonexistent')))\n"
                "except RefError as exc:\n"
                "    print(exc.exit_code, exc.message)\n")
        result = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3",
                                 "-c", code, str(locked)], cwd=shared, capture_output=True, text=True, timeout=60,
                                env={"PYTHONPATH": str(REPO_ROOT), "HOME": str(shared), "PATH": "/usr/bin:/bin"})
        assert result.stdout == f"2 folder {locked} is not readable (permission denied)\n", result.stderr
    finally:
        shutil.rmtree(shared, ignore_errors=True)


def test_files_by_basename_glob_and_did_you_mean(story: dict) -> None:
    folder = story["folder"]
    rewrite(folder / "model_executor" / "runner" / "decode_cuda_graph_runner.py", "# hot-fixed\n")
    expected_same = sorted(p for p in tree_hashes(story["site"])
                           if p.startswith("sglang/srt/speculative/dflash_") and p != WORKER)
    # A file name: every file so called.
    by_name = run_inproc("diff", "--name-status", "-s", "./remote_sglang_snapshot", "ct200", "--",
                         "dflash_worker.py", "decode_cuda_graph_runner.py")
    assert by_name.code == 1, by_name.err
    runner = "sglang/srt/model_executor/runner/decode_cuda_graph_runner.py"
    assert by_name.out == f"M\t{runner}\nM\t{WORKER}\n"
    assert f"2 files compared: {runner}, {WORKER}" in by_name.err
    # A glob on file names: the two that differ are shown, the identical ones listed with -s.
    glob = run_inproc("diff", "--name-status", "-s", "./remote_sglang_snapshot", "ct200", "--",
                      "speculative/dflash_*.py")
    assert glob.code == 1
    assert glob.out == f"M\t{WORKER}\n" + "".join(f"=  {p}\n" for p in expected_same)
    assert f"{len(expected_same) + 1} files compared: " in glob.err
    # Without -s, no `=` lines; a glob of many files gives the count per operand.
    many = run_inproc("diff", "--name-status", "./remote_sglang_snapshot", "ct200", "--", "*.py")
    py_files = [p for p in tree_hashes(story["site"]) if p.startswith("sglang/srt/") and p.endswith(".py")]
    assert many.code == 1 and "=  " not in many.out
    assert f"{len(py_files)} files compared (*.py: {len(py_files)})" in many.err
    # Nothing matches: exit 2 with the nearest names by file name.
    missing = run_inproc("diff", "ct200@live", "./remote_sglang_snapshot", "--", "speculative/dflash_workers.py")
    assert missing.code == 2
    assert "path 'speculative/dflash_workers.py' matches no file" in missing.err
    assert f"did you mean {WORKER}" in missing.err


def test_did_you_mean_offers_the_v2_worker_on_a_pristine_node(story: dict) -> None:
    """The node of the wheel has dflash_worker_v2.py only: asking for dflash_worker.py offers it."""
    (story["site"] / WORKER).unlink()
    shutil.rmtree(story["folder"])
    linked_copy(story["site"] / "sglang" / "srt", story["folder"])
    result = run_inproc("diff", "./remote_sglang_snapshot", "ct200", "--", "dflash_worker.py")
    assert result.code == 2
    assert "did you mean sglang/srt/speculative/dflash_worker_v2.py" in result.err


def test_patch_new_from_a_folder(story: dict, tmp_path: Path) -> None:
    assert run_inproc("pull", "ct200").code == 0
    (story["folder"] / "speculative" / "new_helper.py").write_text("HELPER = 1\n")
    result = run_inproc("patch", "new", "may22-fix", "--base", "ct200", "--from", "./remote_sglang_snapshot")
    assert result.code == 0, result.err
    assert f"M  {WORKER}" in result.err and "A  sglang/srt/speculative/new_helper.py" in result.err
    assert result.out == f"{Path.cwd() / '.snapver-patches' / 'may22-fix'}\n"  # stdout: the folder alone
    exported = run_inproc("patch", "export", "may22-fix")
    assert exported.code == 0
    # The exported patch turns a copy of the node's tree into the folder's (checked with patch -p1).
    work = tmp_path / "apply"
    linked_copy(story["site"], work)
    subprocess.run(["patch", "-p1", "-s"], input=exported.out.encode(), cwd=work, check=True)
    patched = {p[len("sglang/srt/"):]: v for p, v in tree_hashes(work).items()}
    name = story["folder"].name
    wanted = {p[len(name) + 1:]: v for p, v in tree_hashes(story["folder"].parent, paths=(name,)).items()}
    assert patched == wanted
    # A folder that does not exist writes no patch.
    bad = run_inproc("patch", "new", "other", "--base", "ct200", "--from", "./nope")
    assert bad.code == 2 and "no such folder: ./nope" in bad.err
    assert "other" not in run_inproc("patch", "list").out


def test_a_folder_standing_for_one_tracked_path_is_compared_on_that_path_only(make_site_packages, local_node,
                                                                              write_config) -> None:
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n", "sglang/lang/b.py": "b = 1\n"})
    write_config({"n1": local_node(site, paths=["sglang/srt", "sglang/lang"])})
    copy = Path.cwd() / "srt-copy"
    copy.mkdir()
    (copy / "a.py").write_text("a = 2\n")
    result = run_inproc("diff", "--name-status", "./srt-copy", "n1")
    assert (result.code, result.out) == (1, "M\tsglang/srt/a.py\n"), result.err
    # A site-packages copy holding both tracked paths is compared on both.
    both = make_site_packages("copy", files={"sglang/srt/a.py": "a = 1\n", "sglang/lang/b.py": "b = 2\n"})
    result = run_inproc("diff", "--name-status", str(both), "n1")
    assert (result.code, result.out) == (1, "M\tsglang/lang/b.py\n"), result.err
