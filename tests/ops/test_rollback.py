"""Rollback: a node's tree restored exactly (content, mode, links, deletions, additions).

Trees are compared with the test's own hashing (``tree_hashes``), records read with git.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

from helpers import tree_hashes

from snapver.config import load_config
from snapver.errors import ConflictError
from snapver.ops.patch import import_patch
from snapver.ops.pull import pull
from snapver.ops.push import apply_push, plan_push
from snapver.ops.rollback import apply_rollback, plan_rollback
from snapver.store.repo import Store

ODD = {
    "sglang/srt/a.py": "a = 1\n",
    'sglang/srt/odd name "quoted".py': "odd = 1\n",
    "sglang/srt/new\nline.py": "newline = 1\n",
    os.fsdecode(b"sglang/srt/caf\xe9.py"): "latin1 = 1\n",
    "sglang/srt/sub/deep.py": "deep = 1\n",
    "sglang/srt/日本.py": "utf8 = 1\n",
}


def records(store: Path, node: str) -> list[dict]:
    out = subprocess.run(["git", "--git-dir", str(store), "log", "--format=%B%x00", f"refs/heads/pushes/{node}"],
                         capture_output=True, text=True, check=True).stdout
    return [json.loads(line[len("snapver-meta: "):]) for body in out.split("\0")
            for line in body.splitlines() if line.startswith("snapver-meta: ")]


def snapshot(config_path: Path, node: str, tag: str | None = None) -> Store:
    config = load_config(str(config_path))
    store = Store.open_or_create(config.store_path)
    assert pull(store, config.select([node]), tag=tag).exit_code == 0
    return store


def test_rollback_to_a_snapshot_is_exact(make_site_packages, write_config, ssh_node, run_snapver, isolated_env):
    site = make_site_packages("ct200", files=ODD)
    os.chmod(site / 'sglang/srt/odd name "quoted".py', 0o750)
    os.symlink("a.py", site / "sglang/srt/link.py")
    os.symlink("sub", site / "sglang/srt/dirlink")
    config_path = write_config({"ct200": ssh_node("ct200", site)})
    snapshot(config_path, "ct200", tag="s1")
    recorded = tree_hashes(site)

    # Everything a node can drift by: content, mode, deletion, addition (in a new folder),
    # a link retargeted, a file turned into a link, stale bytecode.
    (site / "sglang/srt/a.py").write_text("a = 'changed'\n")
    os.chmod(site / 'sglang/srt/odd name "quoted".py', 0o600)
    (site / "sglang/srt/new\nline.py").unlink()
    (site / "sglang/srt/added/deeper").mkdir(parents=True)
    (site / "sglang/srt/added/deeper/x.py").write_text("x = 1\n")
    os.unlink(site / "sglang/srt/link.py")
    os.symlink("sub/deep.py", site / "sglang/srt/link.py")
    latin1 = site / os.fsdecode(b"sglang/srt/caf\xe9.py")
    latin1.unlink()
    os.symlink("a.py", latin1)
    (site / "sglang/srt/__pycache__").mkdir()
    (site / "sglang/srt/__pycache__/a.cpython-311.pyc").write_bytes(b"stale")
    (site / "sglang/srt/__pycache__/other.cpython-311.pyc").write_bytes(b"kept")
    drifted = tree_hashes(site)
    assert drifted != recorded

    planned = run_snapver("rollback", "ct200", "--to", "s1", "--dry-run")
    assert planned.code == 0, planned
    assert "6 to write" in planned.out and "dry run: nothing written" in planned.out
    assert tree_hashes(site) == drifted

    result = run_snapver("rollback", "ct200", "--to", "s1", "--yes")
    assert result.code == 0, result
    assert tree_hashes(site) == recorded
    assert stat.S_IMODE(os.stat(site / 'sglang/srt/odd name "quoted".py').st_mode) == 0o750
    assert os.readlink(site / "sglang/srt/link.py") == "a.py" and os.readlink(site / "sglang/srt/dirlink") == "sub"
    assert not (site / "sglang/srt/added").exists()  # folders it emptied are gone too
    assert not (site / "sglang/srt/__pycache__/a.cpython-311.pyc").exists()
    assert (site / "sglang/srt/__pycache__/other.cpython-311.pyc").exists()

    store = isolated_env / "snapshots"
    tag = subprocess.run(["git", "--git-dir", str(store), "rev-parse", "refs/tags/s1"], capture_output=True,
                         text=True, check=True).stdout.strip()
    rows = records(store, "ct200")
    assert [(r["action"], r["state"], r["target"]) for r in rows] == [("rollback", "done", tag),
                                                                      ("rollback", "started", tag)]
    with plan_rollback(Store(store), load_config(str(config_path)), "ct200", "s1") as again:
        assert again.nothing_to_do and apply_rollback(Store(store), again) is None
    assert len(records(store, "ct200")) == 2


def test_rollback_defaults_to_before_the_last_push(make_site_packages, write_config, local_node, run_snapver,
                                                   isolated_env):
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n", "sglang/srt/b.py": "b = 1\n"})
    config_path = write_config({"n1": local_node(site)})
    store = snapshot(config_path, "n1")
    refused = run_snapver("rollback", "n1", "--yes")
    assert refused.code == 2 and "no push to n1 is recorded" in refused.err and "--to" in refused.err, refused
    unknown = run_snapver("rollback", "ghost", "--yes")
    assert unknown.code == 2 and "unknown node or group 'ghost'" in unknown.err

    config = load_config(str(config_path))
    for name, rel in (("p1", "sglang/srt/a.py"), ("p2", "sglang/srt/b.py")):
        var = rel[-4]
        diff = f"--- a/{rel}\n+++ b/{rel}\n@@ -1 +1 @@\n-{var} = 1\n+{var} = 2\n".encode()
        import_patch(store, config, name, diff, name, "n1", ["n1"])
        with plan_push(store, config, name) as plan:
            assert [run.state for run in apply_push(store, plan).nodes] == ["done"]
        if name == "p1":
            after_p1 = tree_hashes(site)
    assert (site / "sglang/srt/b.py").read_text() == "b = 2\n"

    result = run_snapver("rollback", "n1", "--yes", "--json")
    assert result.code == 0, result
    document = json.loads(result.out)  # one node: the one-node document, as before several could be named
    assert (document["node"], document["result"]["state"]) == ("n1", "done") and "before the push of p2" \
        in document["reason"], document
    assert tree_hashes(site) == after_p1
    again = run_snapver("rollback", "n1", "--yes")
    assert again.code == 0 and "nothing to do" in again.out


def test_rollback_refuses_a_node_changed_after_its_plan(make_site_packages, write_config, local_node,
                                                       isolated_env):
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n", "sglang/srt/b.py": "b = 1\n"})
    config_path = write_config({"n1": local_node(site)})
    store = snapshot(config_path, "n1", tag="t1")
    (site / "sglang/srt/a.py").write_text("a = 2\n")
    (site / "sglang/srt/b.py").write_text("b = 2\n")
    with plan_rollback(store, load_config(str(config_path)), "n1", "t1") as plan:
        assert [s.path for s in plan.node.writes] == ["sglang/srt/a.py", "sglang/srt/b.py"]
        (site / "sglang/srt/b.py").write_text("b = 'meanwhile'\n")
        run = apply_rollback(store, plan)
    assert run is not None and run.state == "failed" and isinstance(run.error, ConflictError)
    assert "sglang/srt/b.py" in str(run.error) and run.exit_code == 1
    # Nothing was written: the node refused before touching a single file.
    assert (site / "sglang/srt/a.py").read_text() == "a = 2\n"
    assert (site / "sglang/srt/b.py").read_text() == "b = 'meanwhile'\n"
    assert records(isolated_env / "snapshots", "n1")[0]["state"] == "failed"


def test_rollback_of_a_node_a_stopped_push_never_reached_warns(make_site_packages, write_config, local_node,
                                                              isolated_env):
    """n2's newest record is a push that stopped in waves before it: undoing "the last push"
    there undoes the push before, and the plan says so."""
    from snapver.ops.push import apply_push_waves

    sites = {name: make_site_packages(name, files={"sglang/srt/a.py": "a = 1\n"}) for name in ("n1", "n2")}
    config_path = write_config({name: local_node(site) for name, site in sites.items()}, groups={"all": ["n1", "n2"]})
    config = load_config(str(config_path))
    store = Store.open_or_create(config.store_path)
    assert pull(store, config.select(["all"])).exit_code == 0
    def patch(name: str, old: str, new: str) -> None:  # on n1's newest snapshot
        diff = f"--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -1 +1 @@\n-a = {old}\n+a = {new}\n".encode()
        import_patch(store, config, name, diff, name, "n1", ["all"])

    patch("p1", "1", "2")
    with plan_push(store, config, "p1") as plan:
        assert [run.state for run in apply_push(store, plan).nodes] == ["done", "done"]
    patch("p2", "2", "3")
    with plan_push(store, config, "p2") as plan:
        stopped = apply_push_waves(store, config, plan, "1,100%", between=lambda index, names: False)
    assert [(run.node, run.state) for run in stopped.nodes] == [("n1", "done"), ("n2", "cancelled")]
    with plan_rollback(store, config, "n2") as plan:
        assert plan.node.notes == ["the newest push (p2) never reached n2 (its rollout stopped in waves): this "
                                   "undoes the push before it"]
        assert "before the push of p1" in plan.reason
    with plan_rollback(store, config, "n1") as plan:
        assert plan.node.notes == [] and "before the push of p2" in plan.reason


def _push(store: Store, config, name: str, rel: str, old: str, new: str, health: str | None = None) -> str:
    """Import patch ``name`` (``rel``: ``old`` → ``new``) on n1's newest snapshot and push it; its state."""
    var = rel[-4]
    diff = f"--- a/{rel}\n+++ b/{rel}\n@@ -1 +1 @@\n-{var} = {old}\n+{var} = {new}\n".encode()
    import_patch(store, config, name, diff, name, "n1", ["n1"])
    with plan_push(store, config, name) as plan:
        [run] = apply_push(store, plan, health=health).nodes
    return run.state


def test_a_failed_push_after_a_good_one_keeps_the_restore_point_before_the_good_one(
        make_site_packages, write_config, local_node, run_snapver, isolated_env):
    """p1 written; p2 fails its health check and is rolled back: `rollback n1` undoes p1,
    to the snapshot taken before p1 (the rolled-back p2 is not "the last push")."""
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n", "sglang/srt/b.py": "b = 1\n"})
    config_path = write_config({"n1": local_node(site)})
    store, config = snapshot(config_path, "n1"), load_config(str(config_path))
    original = tree_hashes(site)
    assert _push(store, config, "p1", "sglang/srt/a.py", "1", "2") == "done"
    assert _push(store, config, "p2", "sglang/srt/b.py", "1", "2", health="exit 1") == "rolled-back"
    p1_before = [r for r in records(isolated_env / "snapshots", "n1") if r.get("patch") == "p1"][0]["before"]

    result = run_snapver("rollback", "n1", "--yes", "--json")
    assert result.code == 0, result
    document = json.loads(result.out)
    assert document["target"] == p1_before and "before the push of p1" in document["reason"], document
    assert tree_hashes(site) == original


def test_a_push_after_a_failed_one_keeps_its_restore_point(make_site_packages, write_config, local_node,
                                                           run_snapver, isolated_env):
    """p1's undo is refused (its health check edits the file it wrote: left alone, record
    "failed", the node part-written); p2 then goes through: its record still restores to
    before p1, and so does `rollback n1`."""
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n", "sglang/srt/b.py": "b = 1\n"})
    config_path = write_config({"n1": local_node(site)})
    store, config = snapshot(config_path, "n1"), load_config(str(config_path))
    edits = "echo '# hand-fixed' >> \"$SNAPVER_SITE_PACKAGES/sglang/srt/a.py\"; exit 1"
    assert _push(store, config, "p1", "sglang/srt/a.py", "1", "2", health=edits) == "failed"
    assert (site / "sglang/srt/a.py").read_text() == "a = 2\n# hand-fixed\n"
    assert _push(store, config, "p2", "sglang/srt/b.py", "1", "2") == "done"
    p2, p1 = records(isolated_env / "snapshots", "n1")[0], records(isolated_env / "snapshots", "n1")[2]
    assert (p2["patch"], p2["state"], p1["patch"], p1["state"]) == ("p2", "done", "p1", "failed")
    assert p2["restore"] == p1["before"] != p2["before"]

    result = run_snapver("rollback", "n1", "--yes", "--json")
    assert result.code == 0, result
    assert json.loads(result.out)["target"] == p1["before"], result.out
    assert (site / "sglang/srt/b.py").read_text() == "b = 1\n"


def test_a_push_after_a_rolled_back_one_restores_to_its_own_before_snapshot(
        make_site_packages, write_config, local_node, run_snapver, isolated_env):
    """p1 written; p2 rolled back (health); p3 written: `rollback n1` undoes p3 alone, to the
    snapshot taken just before p3 (p1 stays); neither finished push carries an older point."""
    site = make_site_packages("n1", files={"sglang/srt/a.py": "a = 1\n", "sglang/srt/b.py": "b = 1\n"})
    config_path = write_config({"n1": local_node(site)})
    store, config = snapshot(config_path, "n1"), load_config(str(config_path))
    assert _push(store, config, "p1", "sglang/srt/a.py", "1", "2") == "done"
    assert _push(store, config, "p2", "sglang/srt/b.py", "1", "2", health="exit 1") == "rolled-back"
    assert _push(store, config, "p3", "sglang/srt/b.py", "1", "3") == "done"
    p3 = records(isolated_env / "snapshots", "n1")[0]
    assert p3["patch"] == "p3" and p3["restore"] == p3["before"]

    result = run_snapver("rollback", "n1", "--yes", "--json")
    assert result.code == 0, result
    assert json.loads(result.out)["target"] == p3["before"], result.out
    assert (site / "sglang/srt/a.py").read_text() == "a = 2\n" and (site / "sglang/srt/b.py").read_text() == "b = 1\n"
