"""snapver import DIR --node NAME [--date] [--tag] [-m] (issue 13, point 4).

The story's May 22 copy of ct200's srt is recorded as a snapshot dated 2026-05-22 and
found by ``ct200@may22`` and ``may22``; the store is read back with the git command
line, and file content checked against ``git hash-object`` of the folder's files.
"""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime
from pathlib import Path

import pytest
from helpers import linked_copy, rewrite
from snapver_inproc import run_inproc

WORKER = "sglang/srt/speculative/dflash_worker.py"
WORKER_TEXT = "class DFlashWorker:\n    graph_bs = [1, 2, 4, 8]\n"
FIXED_TEXT = WORKER_TEXT + "    # may22: capture the cuda graph after warm-up\n"


def git(*args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(Path.cwd() / "snapshots"), *args], check=True,
                          capture_output=True, text=True).stdout


def refs_now() -> str:
    return git("for-each-ref", "--format=%(refname) %(objectname)")


def hash_object(path: Path) -> str:
    return subprocess.run(["git", "hash-object", str(path)], check=True, capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture
def story(make_site_packages, sglang_site_template, ssh_node, write_config) -> dict:
    """Node ct200 (sshd), pulled once today; ``remote_sglang_snapshot/`` holds its srt as of
    May 22: the same tree but dflash_worker.py, which was different then."""
    site = make_site_packages("ct200", sglang_site_template, {WORKER: WORKER_TEXT})
    write_config({"ct200": ssh_node("ct200", site)})
    folder = Path.cwd() / "remote_sglang_snapshot"
    linked_copy(site / "sglang" / "srt", folder)
    rewrite(folder / "speculative" / "dflash_worker.py", FIXED_TEXT)
    pulled = run_inproc("pull", "ct200")
    assert pulled.code == 0, pulled.err
    return {"site": site, "folder": folder, "pull": git("rev-parse", "refs/heads/nodes/ct200").strip()}


def test_story_import_dated_may22_is_found_by_node_at_may22_and_by_its_tag(story: dict) -> None:
    result = run_inproc("import", "./remote_sglang_snapshot", "--node", "ct200", "--date", "2026-05-22",
                        "--tag", "may22", "-m", "May 22 copy, before the cuda-graph fix")
    assert result.code == 0, result.err
    assert "ct200: imported snapshot" in result.out and "dated 2026-05-22 00:00 (--date)" in result.out
    assert "./remote_sglang_snapshot/ = sglang/srt/ (the inside of sglang/srt" in result.err
    imported = git("rev-parse", "refs/tags/may22").strip()
    # The node's branch did not move: ct200@latest is still today's pull.
    assert git("rev-parse", "refs/heads/nodes/ct200").strip() == story["pull"]
    assert f"ct200@latest stays {story['pull'][:10]}" in result.out
    # A real snapshot: dated May 22, metadata event import, the folder's bytes in its tree.
    assert git("log", "-1", "--format=%ad", "--date=format-local:%Y-%m-%d %H:%M", imported).strip() == \
        "2026-05-22 00:00"
    body = git("log", "-1", "--format=%B", imported)
    meta = json.loads(body.split("snapver-meta: ", 1)[1])
    assert (meta["event"], meta["node"], meta["kind"], meta["message"]) == (
        "import", "ct200", "snapshot", "May 22 copy, before the cuda-graph fix")
    assert git("rev-parse", f"{imported}:{WORKER}").strip() == \
        hash_object(story["folder"] / "speculative" / "dflash_worker.py")
    # Found by node@date (its day and after, until the next snapshot), by the tag and by id.
    for ref in ("ct200@may22", "ct200@2026-05-22", "ct200@2026-06-30", "may22", imported[:8]):
        shown = run_inproc("show", "--json", ref)
        assert shown.code == 0, (ref, shown.err)
        assert json.loads(shown.out)["id"] == imported, ref
    assert run_inproc("show", "ct200@2026-05-21").code == 2
    for args in (("ct200@may22", "ct200"), ("may22", "ct200")):
        diffed = run_inproc("diff", "--name-status", *args)
        assert (diffed.code, diffed.out) == (1, f"M\t{WORKER}\n"), (args, diffed.err)
    assert run_inproc("show", "ct200@latest", WORKER).out == WORKER_TEXT
    assert run_inproc("show", "ct200@may22", WORKER).out == FIXED_TEXT
    # log lists it in date order; tag names it.
    logged = json.loads(run_inproc("log", "--json", "ct200").out)["snapshots"]
    assert [s["id"] for s in logged] == [story["pull"], imported]
    assert run_inproc("tag", "known-good", "ct200@may22").code == 0
    assert git("rev-parse", "refs/tags/known-good").strip() == imported


def test_bare_date_finds_an_import_without_a_tag(story: dict) -> None:
    assert run_inproc("import", "./remote_sglang_snapshot", "--node", "ct200", "--date", "2026-05-22T09:30").code == 0
    shown = run_inproc("show", "--json", "may22")
    assert shown.code == 0, shown.err
    document = json.loads(shown.out)
    assert document["meta"]["event"] == "import"
    assert datetime.fromisoformat(document["time"]).strftime("%Y-%m-%d %H:%M") == "2026-05-22 09:30"


def test_imports_take_their_place_in_date_order(story: dict) -> None:
    worker = story["folder"] / "speculative" / "dflash_worker.py"
    assert run_inproc("import", "./remote_sglang_snapshot", "--node", "ct200", "--date", "2026-05-22").code == 0
    worker.write_text(FIXED_TEXT + "    # june 1\n")
    assert run_inproc("import", "./remote_sglang_snapshot", "--node", "ct200", "--date", "2026-06-01").code == 0
    june_text = run_inproc("show", "ct200@2026-06-02", WORKER)
    assert june_text.out == FIXED_TEXT + "    # june 1\n"
    assert run_inproc("show", "ct200@2026-05-31", WORKER).out == FIXED_TEXT
    assert run_inproc("show", "ct200@latest", WORKER).out == WORKER_TEXT
    assert git("rev-parse", "refs/heads/nodes/ct200").strip() == story["pull"]
    # Each older import is kept by a ref of its own beside the branch, the June one on the May one.
    kept = git("for-each-ref", "--format=%(objectname)", "refs/heads/imports/ct200/").split()
    assert len(kept) == 2
    june = json.loads(run_inproc("show", "--json", "ct200@2026-06-02").out)["id"]
    may = json.loads(run_inproc("show", "--json", "ct200@2026-05-31").out)["id"]
    assert git("rev-parse", f"{june}^").strip() == may
    logged = [s["id"] for s in json.loads(run_inproc("log", "--json").out)["snapshots"]]
    assert logged == [story["pull"], june, may]


def test_node_tilde_n_is_row_n_plus_1_of_its_log_imports_included(story: dict) -> None:
    """SPEC: `ct200~2` is two snapshots before its newest. Imports older than the head sit
    beside its branch, off its first parents: `~N` skipped them (`ct200~2` was refused with
    "only 1 snapshot(s) before it" while `log ct200` listed four)."""
    worker = story["folder"] / "speculative" / "dflash_worker.py"
    assert run_inproc("import", "./remote_sglang_snapshot", "--node", "ct200", "--date", "2026-05-22").code == 0
    worker.write_text(FIXED_TEXT + "    # june 1\n")
    assert run_inproc("import", "./remote_sglang_snapshot", "--node", "ct200", "--date", "2026-06-01").code == 0
    (story["site"] / WORKER).write_text(WORKER_TEXT + "    # pulled again\n")
    assert run_inproc("pull", "ct200").code == 0
    logged = [s["id"] for s in json.loads(run_inproc("log", "--json", "ct200").out)["snapshots"]]
    assert len(logged) == 4 and logged[1] == story["pull"]
    assert logged[0] == git("rev-parse", "refs/heads/nodes/ct200").strip()
    for ref, row in (("ct200~0", 0), ("ct200@latest", 0), ("ct200~", 1), ("ct200~1", 1), ("ct200~2", 2),
                     ("ct200~3", 3), ("ct200@latest~3", 3), ("ct200@2026-06-02~1", 3), (f"{logged[1]}~2", 3)):
        shown = run_inproc("show", "--json", ref)
        assert shown.code == 0, (ref, shown.err)
        assert json.loads(shown.out)["id"] == logged[row], ref
    assert run_inproc("show", "ct200~2", WORKER).out == FIXED_TEXT + "    # june 1\n"
    too_far = run_inproc("show", "ct200~4")
    assert too_far.code == 2 and "'ct200~4': ct200 has only 3 snapshot(s) before it" in too_far.err, too_far.err
    assert run_inproc("show", "ct200@may22~1").code == 2


def test_import_newer_than_the_head_moves_it_and_a_new_name_is_an_archive(story: dict) -> None:
    # Dated by its files: the newest mtime, said so.
    when = datetime(2026, 3, 1, 12, 0).timestamp()
    for root, _, files in os.walk(story["folder"]):
        for name in files:
            os.utime(os.path.join(root, name), (when, when))
    archived = run_inproc("import", "./remote_sglang_snapshot", "--node", "archive")
    assert archived.code == 0, archived.err
    assert "dated 2026-03-01 12:00 (the newest file's mtime" in archived.out
    head = git("rev-parse", "refs/heads/nodes/archive").strip()
    assert run_inproc("show", "--json", "archive@latest").out and \
        json.loads(run_inproc("show", "--json", "archive@latest").out)["id"] == head
    assert not git("for-each-ref", "refs/heads/imports/")
    # An import newer than the node's newest snapshot becomes its newest, on its branch.
    (story["folder"] / "speculative" / "dflash_worker.py").write_text(FIXED_TEXT + "    # april\n")
    newer = run_inproc("import", "./remote_sglang_snapshot", "--node", "archive", "--date", "2026-04-01")
    assert newer.code == 0, newer.err
    tip = git("rev-parse", "refs/heads/nodes/archive").strip()
    assert tip != head and git("rev-parse", f"{tip}^").strip() == head
    assert run_inproc("show", "archive@latest", WORKER).out == FIXED_TEXT + "    # april\n"
    assert not git("for-each-ref", "refs/heads/imports/")
    # log's first row is archive@latest and archive~0; archive~1 the one before.
    logged = [s["id"] for s in json.loads(run_inproc("log", "--json", "archive").out)["snapshots"]]
    assert logged == [tip, head]
    for ref, commit in (("archive~0", tip), ("archive~1", head)):
        assert json.loads(run_inproc("show", "--json", ref).out)["id"] == commit, ref


def test_a_spoken_date_dates_the_import_as_refs_read_it(story: dict) -> None:
    """``--date may22`` names the day ``ct200@may22`` finds (was: "not a date", exit 2)."""
    from snapver.refs import parse_day

    day = parse_day("may22")
    result = run_inproc("import", "./remote_sglang_snapshot", "--node", "ct200", "--date", "may22")
    assert result.code == 0, result.err
    assert f"dated {day:%Y-%m-%d} 00:00 (--date)" in result.out, result.out
    found = run_inproc("show", "ct200@may22", WORKER)
    assert found.code == 0 and found.out == FIXED_TEXT, found


def test_bad_input_exits_2_and_writes_nothing(story: dict, tmp_path: Path) -> None:
    (tmp_path / "nothing-tracked").mkdir()
    (tmp_path / "nothing-tracked" / "README").write_text("no python\n")
    assert run_inproc("tag", "taken", "ct200").code == 0
    before = refs_now()
    folder = "./remote_sglang_snapshot"
    cases = [
        ((folder, "--node", "ct200", "--date", "2099-01-01"), "--date '2099-01-01' is in the future"),
        ((folder, "--node", "ct200", "--date", "yesterday"), "--date 'yesterday' is not a date"),
        ((folder, "--node", "ct200", "--date", "2026-13-01"), "--date '2026-13-01' is not a date"),
        ((folder, "--node", "ct200", "--date", "feb30"), "--date 'feb30' is not a date"),
        (("./missing", "--node", "ct200"), "no such folder: ./missing"),
        ((str(tmp_path / "nothing-tracked"), "--node", "ct200"), "holds none of the tracked paths"),
        ((folder, "--node", "bad name"), "invalid node name 'bad name'"),
        ((folder, "--node", "b" * 300), "invalid node name 'bbbbb"),  # was a store error (exit 4): git's ref
        ((folder, "--node", "ct200", "--date", "2026-05-22", "--tag", "taken"), "tag 'taken' already names"),
    ]
    for args, message in cases:
        result = run_inproc("import", *args)
        assert result.code == 2, (args, result.out, result.err)
        assert message in result.err, result.err
        assert result.err.count("snapver: error:") == 1
    assert refs_now() == before
    assert not list((Path.cwd() / "snapshots").glob("snapver/scratch*"))


def test_a_symlink_pointing_outside_is_recorded_as_a_link(story: dict) -> None:
    secret = Path.cwd() / "secret.txt"
    secret.write_text("never in the store\n")
    (story["folder"] / "speculative" / "outside.py").symlink_to(secret)
    (story["folder"] / "up").symlink_to("../..")
    result = run_inproc("import", "./remote_sglang_snapshot", "--node", "ct200", "--date", "2026-05-22")
    assert result.code == 0, result.err
    commit = json.loads(run_inproc("show", "--json", "ct200@may22").out)["id"]
    listing = git("ls-tree", commit, "sglang/srt/speculative/outside.py", "sglang/srt/up")
    modes = {line.split("\t")[1]: line.split()[0] for line in listing.splitlines()}
    assert modes == {"sglang/srt/speculative/outside.py": "120000", "sglang/srt/up": "120000"}
    assert git("cat-file", "-p", f"{commit}:sglang/srt/speculative/outside.py") == str(secret)
    assert git("cat-file", "-p", f"{commit}:sglang/srt/up") == "../.."
    # Nothing behind the links was read: no tree under up/, no blob of the secret.
    assert not git("ls-tree", "-r", commit, "sglang/srt/up/")
    assert hash_object(secret) not in git("ls-tree", "-r", commit)


def test_a_folder_with_a_300mb_file_is_imported_in_bounded_memory(write_config, local_node, make_site_packages,
                                                                   tmp_path: Path) -> None:
    """A copy of srt holding 300 small files (30 MB) and a 300 MB file: the import stays
    within the client's 100 MiB (SPEC) as a pull of it does — each file stored as it is
    read, never the folder whole. The snapshot holds every file byte for byte (git's own
    ids, checked by `git fsck`), the big one with its blake3 in the manifest."""
    from ops.test_pull_big_files import MiB, file_digests, snapver_measured, write_big  # tests/ is on sys.path

    write_config({"ct200": local_node(make_site_packages("ct200", files={"sglang/srt/x.py": "x = 1\n"}))})
    folder = tmp_path / "old-srt"
    for index in range(300):
        (folder / f"layers/l{index // 30}").mkdir(parents=True, exist_ok=True)
        (folder / f"layers/l{index // 30}/m{index}.py").write_bytes(os.urandom(100 * 1024))
    write_big(folder / "lib/libbig.so", 300, b"import")
    code, output, peak_kib = snapver_measured("import", str(folder), "--root", "sglang/srt", "--node", "ct200",
                                              "--date", "2026-05-22", "--tag", "old", timeout=300)
    assert code == 0, output
    print(f"import: client peak {peak_kib // 1024} MiB")
    assert peak_kib <= 100 * 1024, f"import: client peak {peak_kib // 1024} MiB"
    tree = {line.split("\t", 1)[1]: line.split()[2] for line in git("ls-tree", "-r", "old").splitlines()}
    oid, digest = file_digests(folder / "lib/libbig.so")
    assert tree["sglang/srt/lib/libbig.so"] == oid
    assert git("cat-file", "-s", oid).strip() == str(300 * MiB)
    assert digest in git("show", "old:.snapver/manifest")
    for index in (0, 151, 299):
        path = f"layers/l{index // 30}/m{index}.py"
        assert tree[f"sglang/srt/{path}"] == hash_object(folder / path), path
    assert len([path for path in tree if path.startswith("sglang/srt/")]) == 301
    git("fsck", "--full", "--strict", "--no-dangling")


@pytest.fixture
def small(make_site_packages, local_node, write_config) -> Path:
    """Node n (local), pulled once; returns the cwd, where folders to import are made."""
    site = make_site_packages("n", files={"sglang/srt/a.py": "a = 1\n"})
    write_config({"n": local_node(site)})
    assert run_inproc("pull", "n").code == 0
    return Path.cwd()


def test_a_folder_whose_tracked_path_is_a_link_is_a_bad_folder_not_a_node(small: Path) -> None:
    """`import copy --node n` where copy/sglang/srt is a symlink: exit 3 (a node unreachable)
    with the hint to run `nodes --check`, for a local folder. Now exit 2, the link named, the
    hint about the folder; nothing written."""
    real = small / "real-srt"
    real.mkdir()
    (real / "a.py").write_text("a = 0\n")
    (small / "copy" / "sglang").mkdir(parents=True)
    (small / "copy" / "sglang" / "srt").symlink_to(real)
    before = refs_now()
    result = run_inproc("import", "copy", "--node", "n", "--date", "2026-05-22")
    lines = result.err.splitlines()
    assert result.code == 2 and lines[0].startswith("snapver: error: ") and "copy/sglang/srt" in lines[0], result
    assert len(lines) == 2 and lines[1].startswith("hint: ") and "nodes --check" not in result.err, result
    assert str(real) in lines[1], result  # the folder to import instead
    assert refs_now() == before


def test_an_import_without_date_is_dated_by_its_newest_files_mtime(small: Path) -> None:
    """No --date: the snapshot is dated by the newest mtime among the folder's files (to the
    second), and says which file gave it; an older file or the folder's own mtime does not."""
    folder = small / "copy" / "sglang" / "srt"
    folder.mkdir(parents=True)
    newest = datetime(2026, 3, 4, 5, 6, 7).astimezone()
    for name, moment in (("old.py", newest.timestamp() - 86400 * 30), ("new.py", newest.timestamp() + 0.75),
                         ("mid.py", newest.timestamp() - 3600)):
        (folder / name).write_text(f"# {name}\n")
        os.utime(folder / name, (moment, moment))
    os.utime(folder, (newest.timestamp() + 86400, newest.timestamp() + 86400))  # a folder is not a file
    result = run_inproc("import", "copy", "--node", "n", "--json")
    assert result.code == 0, result
    document = json.loads(result.out)
    assert datetime.fromisoformat(document["time"]) == newest, document
    assert "sglang/srt/new.py" in document["dated_by"], document
    commit = document["commit"]
    assert int(git("log", "-1", "--format=%ct", commit).strip()) == int(newest.timestamp())
    meta = json.loads(git("log", "-1", "--format=%B", commit).split("snapver-meta: ")[1])
    assert datetime.fromisoformat(meta["time"]) == newest, meta
