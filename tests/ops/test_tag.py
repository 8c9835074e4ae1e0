"""snapver tag: create, --list, -d, --force, pull --tag; tags are plain git tags in the store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import toml_dumps
from snapver_inproc import run_inproc

from snapver.config import load_config

FILES = {"sglang/srt/a.py": "a = 1\n"}


def git(store: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def tags_in(store: Path) -> dict[str, str]:
    """``{tag: commit}`` read with git itself."""
    out = git(store, "for-each-ref", "--format=%(refname:short) %(objectname)", "refs/tags/")
    return dict(line.split(" ") for line in out.splitlines())


@pytest.fixture
def project(make_site_packages, tmp_path: Path):
    """Two local nodes, both pulled; returns (config path, store path)."""
    nodes = {name: {"local": True, "site_packages": str(make_site_packages(name, files={
        "sglang/srt/a.py": f"node = {name!r}\n"}))} for name in ("ct200", "ct129")}
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": nodes}))
    for name in nodes:
        assert run_inproc("--config", config, "pull", name).code == 0
    return config, tmp_path / "snapshots"


def test_create_list_and_delete(project) -> None:
    config, store = project
    ct129 = git(store, "rev-parse", "refs/heads/nodes/ct129")
    ct200 = git(store, "rev-parse", "refs/heads/nodes/ct200")
    made = run_inproc("--config", config, "tag", "v1", "ct200")
    assert made.code == 0 and made.out.startswith(f"tagged v1 → {ct200[:10]} (ct200, ")
    assert run_inproc("--config", config, "tag", "rel/2026-05", "ct129@latest").code == 0
    assert tags_in(store) == {"v1": ct200, "rel/2026-05": ct129}
    assert git(store, "tag", "-l").splitlines() == ["rel/2026-05", "v1"]
    listed = run_inproc("--config", config, "tag", "--list")
    assert listed.code == 0
    lines = listed.out.splitlines()
    assert lines[0].split()[:2] == ["rel/2026-05", ct129[:10]] and lines[0].split()[-1] == "ct129"
    assert lines[1].split()[:2] == ["v1", ct200[:10]] and lines[1].split()[-1] == "ct200"
    date = git(store, "log", "-1", "--format=%cd", "--date=format-local:%Y-%m-%d %H:%M", ct200)
    assert date in lines[1]
    document = json.loads(run_inproc("--config", config, "tag", "--list", "--json").out)
    assert [(t["name"], t["commit"], t["node"]) for t in document["tags"]] == [
        ("rel/2026-05", ct129, "ct129"), ("v1", ct200, "ct200")]
    deleted = run_inproc("--config", config, "tag", "-d", "v1")
    assert deleted.code == 0 and f"was {ct200[:10]}" in deleted.out
    assert tags_in(store) == {"rel/2026-05": ct129}
    gone = run_inproc("--config", config, "tag", "-d", "v1")
    assert gone.code == 2 and gone.err.startswith("snapver: error: no tag 'v1'")


def test_default_ref_is_the_newest_snapshot_and_tags_resolve_everywhere(project) -> None:
    config, store = project
    time.sleep(1.1)  # commit times have whole seconds: make ct200's next snapshot the newest for sure
    site = Path(load_config(str(config)).node("ct200").site_packages)
    (site / "sglang/srt/a.py").write_text("changed = True\n")
    assert run_inproc("--config", config, "pull", "ct200").code == 0
    newest = git(store, "rev-parse", "refs/heads/nodes/ct200")
    assert git(store, "log", "-1", "--date-order", "--format=%H", "refs/heads/nodes/ct129",
               "refs/heads/nodes/ct200") == newest
    assert run_inproc("--config", config, "tag", "now").code == 0
    assert tags_in(store)["now"] == newest
    shown = json.loads(run_inproc("--config", config, "show", "--json", "now").out)
    assert shown["id"] == newest
    diffed = run_inproc("--config", config, "diff", "--name-status", "now", "now")
    assert diffed.code == 0 and diffed.out == ""
    against_live = run_inproc("--config", config, "diff", "--json", "now")  # one argument: ct200, live
    document = json.loads(against_live.out)
    assert against_live.code == 0 and document["a"]["commit"] == newest and document["b"]["kind"] == "live"


def test_existing_tags_move_only_with_force(project) -> None:
    config, store = project
    assert run_inproc("--config", config, "tag", "v1", "ct200").code == 0
    again = run_inproc("--config", config, "tag", "v1", "ct200")
    assert again.code == 0 and again.out.startswith("kept v1")
    clash = run_inproc("--config", config, "tag", "v1", "ct129")
    assert clash.code == 2 and "already names" in clash.err and "--force" in clash.err
    assert tags_in(store)["v1"] == git(store, "rev-parse", "refs/heads/nodes/ct200")
    moved = run_inproc("--config", config, "tag", "--force", "v1", "ct129")
    assert moved.code == 0 and moved.out.startswith("moved v1")
    assert tags_in(store)["v1"] == git(store, "rev-parse", "refs/heads/nodes/ct129")


def test_bad_names_and_refs_are_refused(project) -> None:
    config, store = project
    for name in ("bad name", "a@b", "x..y", "end.lock", "tags/x", "a~1", "a:b"):
        result = run_inproc("--config", config, "tag", name, "ct200")
        assert result.code == 2 and "invalid tag name" in result.err, (name, result)
    dash = run_inproc("--config", config, "tag", "--", "-x", "ct200")
    assert dash.code == 2 and "invalid tag name" in dash.err
    for ref, message in (("ct200@live", "only a snapshot fits"), ("nosuch", "unknown ref"),
                         ("ct200~5", "snapshot(s) before it")):
        result = run_inproc("--config", config, "tag", "t", ref)
        assert result.code == 2 and message in result.err, (ref, result)
    assert tags_in(store) == {}


def test_a_tag_named_like_a_node_warns_and_makes_the_name_ambiguous(project) -> None:
    config, store = project
    made = run_inproc("--config", config, "tag", "ct129", "ct200")
    assert made.code == 0 and "note: 'ct129' is also a node" in made.err
    ambiguous = run_inproc("--config", config, "show", "ct129")
    assert ambiguous.code == 2 and "ambiguous ref 'ct129'" in ambiguous.err and "tags/ct129" in ambiguous.err
    shown = json.loads(run_inproc("--config", config, "show", "--json", "tags/ct129").out)
    assert shown["id"] == git(store, "rev-parse", "refs/heads/nodes/ct200")


def test_a_tag_and_a_patch_never_share_a_name(project) -> None:
    """A ref naming both a tag and a patch is ambiguous wherever it is read (`show may22`
    stopped working the moment a patch was named like the tag): each refuses the other's
    names, in every command that makes one, and nothing is written."""
    config, store = project
    assert run_inproc("--config", config, "tag", "may22", "ct200").code == 0
    for made in (run_inproc("--config", config, "patch", "new", "may22", "--base", "ct200"),
                 run_inproc("--config", config, "patch", "capture", "may22", "ct129", "--base", "ct200")):
        assert made.code == 2 and "a patch cannot be named like the tag 'may22'" in made.err, made
    assert git(store, "for-each-ref", "refs/heads/patches/") == ""
    folder = run_inproc("--config", config, "patch", "new", "fix", "--base", "ct200").out.strip().splitlines()[-1]
    assert run_inproc("--config", config, "patch", "save", "fix").code == 0, folder
    before = tags_in(store)
    for made in (run_inproc("--config", config, "tag", "fix", "ct200"),
                 run_inproc("--config", config, "pull", "ct200", "--tag", "fix")):
        assert made.code == 2 and "a tag cannot be named like the patch 'fix'" in made.err, made
    assert tags_in(store) == before
    shown = run_inproc("--config", config, "show", "may22")
    assert shown.code == 0, shown


@pytest.mark.parametrize("transport", ["local", "ssh"])
def test_pull_tag_names_the_new_snapshot(transport: str, make_site_packages, ssh_node, tmp_path: Path) -> None:
    site = make_site_packages("ct200", files=FILES)
    other = make_site_packages("ct129", files=FILES)
    if transport == "local":
        nodes = {"ct200": {"local": True, "site_packages": str(site)},
                 "ct129": {"local": True, "site_packages": str(other)}}
    else:
        nodes = {"ct200": ssh_node("ct200", site), "ct129": ssh_node("ct129", other)}
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": nodes}))
    store = tmp_path / "snapshots"
    assert run_inproc("--config", config, "pull", "--tag", "before-fix", "ct200").code == 0
    assert tags_in(store) == {"before-fix": git(store, "rev-parse", "refs/heads/nodes/ct200")}
    both = run_inproc("--config", config, "pull", "--tag", "x", "ct200", "ct129")
    assert both.code == 2 and "one node" in both.err
    assert "x" not in tags_in(store)


def test_without_a_store(make_site_packages, tmp_path: Path) -> None:
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"nodes": {"ct200": {"local": True, "site_packages": str(
        make_site_packages("ct200", files=FILES))}}}))
    listed = run_inproc("--config", config, "tag", "--list")
    assert listed.code == 0 and "no tags yet" in listed.out
    made = run_inproc("--config", config, "tag", "v1")
    assert made.code == 4 and made.err.startswith("snapver: error: no snapver store")


HOLD_LOCK_THEN_TAG = """
import pathlib, subprocess, sys, time
from snapver.store.lock import store_lock
store, tag, commit, go = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], pathlib.Path(sys.argv[4])
with store_lock(store, wait=5):
    print("locked", flush=True)
    deadline = time.monotonic() + 30
    while not go.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    # What `snapver tag` does under the lock: the tag's ref, made.
    subprocess.run(["git", "--git-dir", str(store), "update-ref", "refs/tags/" + tag, commit], check=True)
"""


def _waits_on_the_lock(pid: int, lock: Path) -> bool:
    """True while process ``pid`` holds the store's lock file open (its wait for the lock)."""
    found = False
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # it has ended
        return False
    for fd in fds:
        try:
            found = found or os.readlink(fd) == str(lock)
        except OSError:  # closed meanwhile
            pass
    return found


def test_a_tag_made_while_pull_tag_waited_is_not_moved(project, tmp_path: Path) -> None:
    """`pull --tag t` checks t is free, then waits for the store lock another command holds;
    that command makes t. The pull records its snapshot and leaves t where it was (exit 2),
    instead of moving it to the new snapshot."""
    config, store = project
    before = git(store, "rev-parse", "refs/heads/nodes/ct200")
    site = Path(load_config(str(config)).nodes["ct200"].site_packages)
    (site / "sglang/srt/a.py").write_text("changed = True\n")
    go = tmp_path / "go"
    root = str(Path(__file__).resolve().parents[2])  # this tree's snapver, in both processes
    env = {**os.environ, "SNAPVER_LOCK_WAIT": "30", "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK_THEN_TAG, str(store), "t", before, str(go)],
                              stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert holder.stdout.readline().strip() == "locked"
        pull = subprocess.Popen([sys.executable, "-m", "snapver", "--config", str(config), "pull", "--json",
                                 "--tag", "t", "ct200"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env)
        lock = (store / "snapver.lock").resolve()
        deadline = time.monotonic() + 20
        seen = 0
        while seen < 3 and time.monotonic() < deadline:  # waiting on the lock, not a passing probe
            seen = seen + 1 if _waits_on_the_lock(pull.pid, lock) else 0
            time.sleep(0.1)
        assert seen == 3, "the pull never waited on the lock"
        go.touch()
        assert holder.wait(timeout=30) == 0
        out, err = pull.communicate(timeout=60)
    finally:
        go.touch()
        holder.kill()
    assert pull.returncode == 2, (out, err)
    assert "was made by another command meanwhile" in err + out
    (node,) = json.loads(out)["nodes"]
    assert node["snapshot"] and node["snapshot"] != before  # recorded, untagged
    assert git(store, "rev-parse", "refs/heads/nodes/ct200") == node["snapshot"]
    assert tags_in(store) == {"t": before}


def test_pull_tag_refuses_a_tag_another_writer_holds(project, tmp_path: Path) -> None:
    """A team store: bob's tag (synced in) is a tag here too; `pull --tag` does not make a
    second value of it (as `snapver tag` would not)."""
    config, store = project
    theirs = git(store, "rev-parse", "refs/heads/nodes/ct129")
    git(store, "update-ref", "refs/remotes/team/bob@lab/tags/shared", theirs)
    result = run_inproc("--config", config, "pull", "--tag", "shared", "ct200")
    assert result.code == 2 and "already names" in result.err, result
    assert "shared" not in tags_in(store)
