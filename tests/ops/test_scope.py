"""A snapshot records the scope it observed (tracked paths and exclude patterns); a
comparison or a restore covers only what both sides observed, and says what it left out.

The scenario is the one a user met: snapshot A taken with ``*.so`` excluded, then ``*.so``
removed from ``exclude``; ``rollback --to A`` and ``diff A NODE`` must leave the compiled
extensions alone. Real sshd nodes; the node's files are checked with the test's own hashing.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from helpers import tree_hashes
from snapver_inproc import run_inproc

SRT = "sglang/srt"
EXTENSIONS = {f"{SRT}/kernels/k{i}.cpython-312-x86_64-linux-gnu.so": bytes([i]) * 64 + b"\0ELF" for i in range(7)}
WITH_SO_EXCLUDED = ["__pycache__/", "*.pyc", "*.so"]


def git(store: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True, text=True,
                          check=True).stdout


def snapshot_meta(store: Path, rev: str) -> dict:
    body = git(store, "log", "-1", "--format=%B", rev)
    (line,) = [line for line in body.splitlines() if line.startswith("snapver-meta: ")]
    return json.loads(line[len("snapver-meta: "):])


def taken_with_so_excluded(make_site_packages, write_config, ssh_node) -> tuple[Path, Path]:
    """Snapshot ``A`` of ct200 taken with ``*.so`` excluded; then the config stops excluding them."""
    site = make_site_packages("ct200", files={f"{SRT}/__init__.py": "", f"{SRT}/a.py": "a = 1\n", **EXTENSIONS})
    config = write_config({"ct200": ssh_node("ct200", site, exclude=WITH_SO_EXCLUDED)})
    pulled = run_inproc("--config", config, "pull", "ct200", "--tag", "A")
    assert pulled.code == 0, pulled
    write_config({"ct200": ssh_node("ct200", site)})  # the default exclude: *.so tracked from now on
    return site, config


def test_a_snapshot_records_the_paths_and_exclude_it_was_taken_with(make_site_packages, write_config, ssh_node,
                                                                     tmp_path: Path) -> None:
    taken_with_so_excluded(make_site_packages, write_config, ssh_node)
    meta = snapshot_meta(Path.cwd() / "snapshots", "refs/tags/A")
    assert meta["paths"] == [SRT] and meta["exclude"] == WITH_SO_EXCLUDED


def test_rollback_to_a_snapshot_leaves_alone_what_it_only_excluded(make_site_packages, write_config,
                                                                    ssh_node) -> None:
    site, config = taken_with_so_excluded(make_site_packages, write_config, ssh_node)
    (site / SRT / "a.py").write_text("a = 'hot-fixed'\n")
    (site / SRT / "b.py").write_text("b = 1\n")  # added since A, inside what A observed
    before = tree_hashes(site)

    planned = run_inproc("--config", config, "rollback", "ct200", "--to", "A", "--dry-run")
    assert planned.code == 0, planned
    assert "left alone: 7 files excluded when A" in planned.out + planned.err, planned

    result = run_inproc("--config", config, "rollback", "ct200", "--to", "A", "--yes")
    assert result.code == 0, result
    after = tree_hashes(site)
    for path in EXTENSIONS:
        assert after[path] == before[path], f"{path} was changed by a rollback to a snapshot that excluded it"
    assert (site / SRT / "a.py").read_text() == "a = 1\n"
    assert not (site / SRT / "b.py").exists()
    # The rollback's own snapshot records the scope it was taken with: the config's now.
    assert snapshot_meta(Path.cwd() / "snapshots", "refs/heads/nodes/ct200")["exclude"] == ["__pycache__/", "*.pyc"]


def test_diff_of_a_snapshot_and_a_node_says_what_it_did_not_compare(make_site_packages, write_config,
                                                                     ssh_node) -> None:
    site, config = taken_with_so_excluded(make_site_packages, write_config, ssh_node)
    same = run_inproc("--config", config, "diff", "A", "ct200", "--name-status")
    assert same.code == 0 and same.out == "", same
    assert "not compared: 7 files excluded when A" in same.err, same

    (site / SRT / "a.py").write_text("a = 2\n")
    changed = run_inproc("--config", config, "diff", "A", "ct200", "--name-status")
    assert changed.code == 1 and changed.out == f"M\t{SRT}/a.py\n", changed

    document = json.loads(run_inproc("--config", config, "diff", "A", "ct200", "--json").out)
    assert [c["path"] for c in document["changes"]] == [f"{SRT}/a.py"]
    assert document["not_compared"]["count"] == 7
    assert sorted(document["not_compared"]["paths"]) == sorted(EXTENSIONS)


def test_a_snapshot_taken_with_more_tracked_is_compared_only_where_the_node_looks_now(
        make_site_packages, write_config, ssh_node) -> None:
    """The other way round: A held the .so files, the config now excludes them."""
    site = make_site_packages("ct200", files={f"{SRT}/a.py": "a = 1\n", **EXTENSIONS})
    config = write_config({"ct200": ssh_node("ct200", site)})
    assert run_inproc("--config", config, "pull", "ct200", "--tag", "A").code == 0
    write_config({"ct200": ssh_node("ct200", site, exclude=WITH_SO_EXCLUDED)})
    (site / SRT / "kernels" / "k0.cpython-312-x86_64-linux-gnu.so").write_bytes(b"rebuilt")
    before = tree_hashes(site)

    result = run_inproc("--config", config, "diff", "A", "ct200", "--name-status")
    assert result.code == 0 and result.out == "", result  # not D: the node's listing leaves them out
    assert "not compared: 7 files excluded by ct200" in result.err, result

    rolled = run_inproc("--config", config, "rollback", "ct200", "--to", "A", "--yes")
    assert rolled.code == 0, rolled
    assert tree_hashes(site) == before  # nothing outside what ct200 tracks now was written


def as_an_older_snapver_wrote_it(store: Path, tag: str) -> str:
    """Rewrite the tagged snapshot (the node's head) without ``exclude`` in its metadata, as
    snapshots were before scopes were recorded (git plumbing: same tree and parents)."""
    rev = f"refs/tags/{tag}"
    meta = snapshot_meta(store, rev)
    del meta["exclude"]
    body = git(store, "log", "-1", "--format=%B", rev)
    lines = [f"snapver-meta: {json.dumps(meta)}" if line.startswith("snapver-meta: ") else line
             for line in body.splitlines()]
    parents = [p for p in git(store, "log", "-1", "--format=%P", rev).split() if p]
    env = {"GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x", "GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@x",
           "PATH": os.environ["PATH"], "HOME": os.environ["HOME"]}
    tree = git(store, "rev-parse", f"{rev}^{{tree}}").strip()
    commit = subprocess.run(["git", "--git-dir", str(store), "commit-tree", tree,
                             *[arg for p in parents for arg in ("-p", p)]], input="\n".join(lines) + "\n",
                            capture_output=True, text=True, check=True, env=env).stdout.strip()
    old = git(store, "rev-parse", rev).strip()
    for ref in (rev, "refs/heads/nodes/ct200"):
        git(store, "update-ref", ref, commit, old)
    return commit


def test_a_snapshot_without_a_recorded_scope_is_said_to_be_assumed_and_restores_delete_only_what_it_observed(
        make_site_packages, write_config, ssh_node) -> None:
    site, config = taken_with_so_excluded(make_site_packages, write_config, ssh_node)
    as_an_older_snapver_wrote_it(Path.cwd() / "snapshots", "A")
    (site / SRT / "b.py").write_text("b = 1\n")  # a .py file A lacks: A observed .py files, so b.py goes
    before = tree_hashes(site)

    result = run_inproc("--config", config, "diff", "A", "ct200", "--json")
    document = json.loads(result.out)
    assert document["a"]["scope"]["recorded"] is False
    assert "does not record the paths and exclude it was taken with" in " ".join(document["not_compared"]["notes"])
    text = run_inproc("--config", config, "diff", "A", "ct200", "--name-status")
    assert "does not record the paths and exclude" in text.err, text

    rolled = run_inproc("--config", config, "rollback", "ct200", "--to", "A", "--yes")
    assert rolled.code == 0, rolled
    assert "left alone: 7 files" in rolled.out + rolled.err, rolled
    after = tree_hashes(site)
    assert {path: after.get(path) for path in EXTENSIONS} == {path: before[path] for path in EXTENSIONS}
    assert not (site / SRT / "b.py").exists()


def test_status_counts_drift_only_where_the_snapshot_looked(make_site_packages, write_config, ssh_node) -> None:
    site, config = taken_with_so_excluded(make_site_packages, write_config, ssh_node)
    result = run_inproc("--config", config, "status", "ct200", "--json")
    (row,) = json.loads(result.out)["nodes"]
    assert row["since_snapshot"] == 0 and row["drift"] == [], row
    assert any("7 files excluded when" in note for note in row["not_compared"]), row

    (site / SRT / "a.py").write_text("a = 2\n")
    (row,) = json.loads(run_inproc("--config", config, "status", "ct200", "--json").out)["nodes"]
    assert [d["path"] for d in row["drift"]] == [f"{SRT}/a.py"], row
    text = run_inproc("--config", config, "status", "ct200")
    assert "not compared: 7 files excluded when" in text.out + text.err, text


# -- the RECORD verdict is worked out for the scope it was asked in -------------------------
SERVER_ARGS = f"{SRT}/server_args.py"


def differing_from_record(config: Path) -> dict[str, list[tuple[str, str]]]:
    result = run_inproc("--config", config, "status", "--json")
    assert result.out, result
    return {row["node"]: sorted((f["path"], f["status"]) for f in row["known_good"]["files"])
            for row in json.loads(result.out)["nodes"]}


def test_the_kept_record_verdict_is_worked_out_again_when_exclude_changes(
        make_site_packages, write_config, ssh_node, sglang_site_template: Path) -> None:
    """status keeps how an unchanged snapshot stands against RECORD; excluding a file RECORD
    lists (one deleted from the node) changes that answer, though neither tree changed."""
    site = make_site_packages("ct200", template=sglang_site_template)
    (site / SERVER_ARGS).unlink()
    config = write_config({"ct200": ssh_node("ct200", site)})
    assert run_inproc("--config", config, "pull").code == 0
    assert differing_from_record(config) == {"ct200": [(SERVER_ARGS, "D")]}
    assert (Path.cwd() / "snapshots" / "snapver" / "record-check" / "ct200.json").exists()

    write_config({"ct200": ssh_node("ct200", site, exclude=["__pycache__/", "*.pyc", SERVER_ARGS])})
    assert differing_from_record(config) == {"ct200": []}


def test_nodes_installed_from_one_wheel_with_different_excludes_are_each_held_to_their_own_rows(
        make_site_packages, write_config, ssh_node, sglang_site_template: Path) -> None:
    """One status reads a RECORD once for every node that has it, but parses it per scope."""
    sites = {name: make_site_packages(name, template=sglang_site_template) for name in ("ct200", "ct129")}
    for site in sites.values():
        with open(site / SERVER_ARGS, "a") as handle:
            handle.write("# hot-fixed\n")
    config = write_config({"ct200": ssh_node("ct200", sites["ct200"]),
                           "ct129": ssh_node("ct129", sites["ct129"],
                                             exclude=["__pycache__/", "*.pyc", SERVER_ARGS])})
    assert differing_from_record(config) == {"ct200": [(SERVER_ARGS, "M")], "ct129": []}


def test_a_hot_fix_to_a_file_the_snapshot_excluded_is_not_hidden_by_the_kept_verdict(
        make_site_packages, write_config, ssh_node, sglang_site_template: Path) -> None:
    """The kept verdict stands for a tree that is all its snapshot's: a file the snapshot
    excluded (tracked since) can change unseen by the drift, so the verdict is worked out again."""
    site = make_site_packages("ct200", template=sglang_site_template)
    config = write_config({"ct200": ssh_node("ct200", site, exclude=["__pycache__/", "*.pyc", SERVER_ARGS])})
    assert run_inproc("--config", config, "pull").code == 0
    write_config({"ct200": ssh_node("ct200", site)})
    assert differing_from_record(config) == {"ct200": []}
    with open(site / SERVER_ARGS, "a") as handle:
        handle.write("# hot-fixed\n")
    assert differing_from_record(config) == {"ct200": [(SERVER_ARGS, "M")]}


def test_an_import_records_the_exclude_it_read_the_folder_with(make_site_packages, write_config, ssh_node,
                                                               tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={f"{SRT}/a.py": "a = 1\n", **EXTENSIONS})
    config = write_config({"ct200": ssh_node("ct200", site, exclude=WITH_SO_EXCLUDED)})
    result = run_inproc("--config", config, "import", str(site / SRT), "--node", "ct200", "--tag", "old")
    assert result.code == 0, result
    meta = snapshot_meta(Path.cwd() / "snapshots", "refs/tags/old")
    assert meta["paths"] == [SRT] and meta["exclude"] == WITH_SO_EXCLUDED
    assert not any(path.endswith(".so") for path in git(Path.cwd() / "snapshots", "ls-tree", "-r", "--name-only",
                                                          "refs/tags/old").splitlines())


def test_show_says_what_a_snapshot_excluded(make_site_packages, write_config, ssh_node) -> None:
    _, config = taken_with_so_excluded(make_site_packages, write_config, ssh_node)
    shown = run_inproc("--config", config, "show", "A")
    assert shown.code == 0 and f"exclude:       {', '.join(WITH_SO_EXCLUDED)}" in shown.out, shown
    as_an_older_snapver_wrote_it(Path.cwd() / "snapshots", "A")
    shown = run_inproc("--config", config, "show", "A")
    assert shown.code == 0 and "exclude:       not recorded" in shown.out, shown
