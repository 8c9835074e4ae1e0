"""A team store (issue 18): two engineers' stores share snapshots, tags, patches and the
push ledger through a real git remote — a bare repository reached by path and over the
real loopback sshd — with `snapver sync`. Checked with git itself on the remote.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import Result, tmpfs, toml_dumps
from snapver_inproc import run_inproc

SRT = "sglang/srt"
FILES = {f"{SRT}/__init__.py": "", f"{SRT}/server_args.py": "port = 30000\n",
         f"{SRT}/speculative/dflash_worker.py": "def step():\n    return 1\n"}
FIXED = "def step():\n    return 2  # hot-fix\n"


def bare_remote(path: Path) -> Path:
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    return path


def engineer(tmp_path: Path, who: str, nodes: dict[str, Any], remote: str, **store: str) -> Path:
    """An engineer's folder with `.snapver` (nodes shared with the other) and a store written
    by `snapver init --writer WHO@lab`; returns the config's path."""
    folder = tmp_path / who
    folder.mkdir()
    config = folder / ".snapver"
    config.write_text(toml_dumps({"store": {"path": "snapshots", "remote": remote, **store}, "nodes": nodes}))
    set_writer(config, f"{who}@lab")
    return config


def set_writer(config: Path, writer: str) -> None:
    """`snapver init --writer WRITER` in the config's folder (init works where it is run)."""
    here = Path.cwd()
    os.chdir(config.parent)
    try:
        assert run_inproc("init", "--writer", writer).code == 0
    finally:
        os.chdir(here)


def snap(config: Path, *args: object) -> Result:
    return run_inproc("--config", config, "--no-pager", *args)


def ok(config: Path, *args: object) -> Result:
    result = snap(config, *args)
    assert result.code == 0, f"snapver {' '.join(map(str, args))}: {result}"
    return result


def one_error(result: Result, code: int, *words: str) -> None:
    """The command failed with ``code`` and one error line (and its hint) holding ``words``."""
    lines = result.err.strip().splitlines()
    assert result.code == code and lines[0].startswith("snapver: error: ") and "Traceback" not in result.err, result
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), result
    assert all(word in lines[0] for word in words), result


def own_head(config: Path, node: str) -> str:
    """The tip of the node's branch in that engineer's own store, read with git."""
    return git_rev(config, f"refs/heads/nodes/{node}")


def git_rev(config: Path, ref: str) -> str:
    return subprocess.run(["git", "--git-dir", str(config.parent / "snapshots"), "rev-parse", ref],
                          check=True, capture_output=True, text=True).stdout.strip()


def same_second_as(config: Path, ref: str, other: str) -> None:
    """Rewrite the commit at ``ref`` in that engineer's store with the commit times of
    ``other`` (tree, parents, message unchanged), and move ``ref`` to it."""
    git = ["git", "--git-dir", str(config.parent / "snapshots")]
    stamp = subprocess.run([*git, "show", "-s", "--format=%ct", other], check=True, capture_output=True,
                           text=True).stdout.strip()
    raw = subprocess.run([*git, "cat-file", "commit", ref], check=True, capture_output=True).stdout
    head, _, message = raw.partition(b"\n\n")
    head = re.sub(rb"^((?:author|committer) .*> )\d+", lambda m: m.group(1) + stamp.encode(), head, flags=re.M)
    commit = subprocess.run([*git, "hash-object", "-t", "commit", "-w", "--stdin"], input=head + b"\n\n" + message,
                            check=True, capture_output=True).stdout.decode().strip()
    subprocess.run([*git, "update-ref", ref, commit], check=True)


def remote_refs(remote: Path) -> dict[str, str]:
    out = subprocess.run(["git", "--git-dir", str(remote), "for-each-ref", "--format=%(refname) %(objectname)"],
                         check=True, capture_output=True, text=True).stdout
    return dict(line.split(" ") for line in out.splitlines())


def fsck(remote: Path) -> None:
    done = subprocess.run(["git", "--git-dir", str(remote), "fsck", "--strict", "--no-progress"],
                          capture_output=True, text=True)
    assert done.returncode == 0 and "error" not in done.stderr + done.stdout, done.stderr + done.stdout


@pytest.fixture
def two_nodes(make_site_packages: Callable[..., Path], local_node: Callable[..., dict[str, Any]]) -> dict[str, Any]:
    return {name: local_node(make_site_packages(name, files=FILES)) for name in ("ct200", "ct129")}


def test_two_engineers_share_the_fleet_through_a_path_remote(tmp_path: Path, two_nodes: dict[str, Any]) -> None:
    remote = bare_remote(tmp_path / "team.git")
    alice = engineer(tmp_path, "alice", two_nodes, str(remote))
    bob = engineer(tmp_path, "bob", two_nodes, str(remote))
    ct200 = Path(two_nodes["ct200"]["site_packages"])

    ok(alice, "pull", "ct200", "ct129")
    ok(alice, "tag", "may22", "ct200")
    assert "published" in ok(alice, "sync").out
    ok(bob, "pull", "ct200", "ct129")  # the same trees: bob's own snapshots, the same blobs
    first = ok(bob, "sync")
    assert "fetched from alice@lab" in first.out
    # Each writer publishes under its own name only; nothing was forced over the other.
    published = remote_refs(remote)
    for who in ("alice@lab", "bob@lab"):
        for node in ("ct200", "ct129"):
            assert f"refs/snapver/{who}/nodes/{node}" in published
    assert published["refs/snapver/alice@lab/tags/may22"] == published["refs/snapver/alice@lab/nodes/ct200"]
    assert not [name for name in published if not name.startswith("refs/snapver/")]

    # Bob hot-fixes ct200 by hand, captures it as a patch, pushes it to ct129, syncs.
    (ct200 / f"{SRT}/speculative/dflash_worker.py").write_text(FIXED)
    ok(bob, "pull", "ct200")
    ok(bob, "patch", "capture", "dflash", "ct200", "--base", "may22", "--nodes", "ct129")
    ok(bob, "push", "dflash", "ct129", "--yes")
    ok(bob, "sync")

    # Alice reads it all: bob's snapshot is ct200's newest, the log says who, status names
    # the push and its writer.
    ok(alice, "sync")
    newest = ok(alice, "show", "ct200@latest", f"{SRT}/speculative/dflash_worker.py").out
    assert newest == FIXED
    log = ok(alice, "log", "ct200").out.splitlines()
    # Three snapshots of ct200, newest (bob's hot-fixed one) first, each saying who took it.
    assert len(log) == 3 and log[0].startswith(own_head(bob, "ct200")[:10]) and "by bob@lab" in log[0], log
    assert sorted(line.rsplit(" by ", 1)[1] for line in log) == ["alice@lab", "bob@lab", "bob@lab"], log
    status = snap(alice, "status", "ct129")
    assert "patch dflash (pushed by bob@lab" in status.out, status
    # Alice rolls ct129 back (the ledger is everyone's: the push to undo was bob's).
    ok(alice, "rollback", "ct129", "--yes")
    original = FILES[f"{SRT}/speculative/dflash_worker.py"]
    assert (Path(two_nodes["ct129"]["site_packages"]) / f"{SRT}/speculative/dflash_worker.py").read_text() == original
    # Her records (the rollback's, and the snapshot after it) read as newer than bob's push
    # even within the same second: git's commit times have whole seconds, and "bob@lab" >
    # "alice@lab" broke such ties. Made certain here: her two commits get the second of bob's.
    for ref in ("refs/heads/pushes/ct129", "refs/heads/nodes/ct129"):
        same_second_as(alice, ref, git_rev(bob, ref))
    assert "rolled back" in snap(alice, "status", "ct129").out
    assert ok(alice, "show", "ct129@latest", f"{SRT}/speculative/dflash_worker.py").out == original

    # Both sync at the same moment, from two processes; then each again, in the other order.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    both = [subprocess.Popen([sys.executable, "-m", "snapver", "--config", str(config), "sync"], env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE) for config in (alice, bob)]
    for process in both:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err.decode()
    ok(bob, "sync")
    ok(alice, "sync")

    for args in (["log"], ["diff", "may22", "ct200"], ["status"], ["patch", "show", "dflash", "--history"],
                 ["tag", "--list"]):
        seen = [snap(config, *args) for config in (alice, bob)]
        # Ages ("5s ago") tick between the two reads, and "10s" is wider than "9s", which
        # widens the table's column: the rest must be the same, but for that padding.
        outs = [re.sub(r" +", " ", re.sub(r"\d+[smhd] ago", "AGE", result.out)) for result in seen]
        assert seen[0].code == seen[1].code and outs[0] == outs[1], (args, seen[0], seen[1])
    assert "rolled back by alice@lab" in snap(bob, "status", "ct129").out
    fsck(remote)


def test_a_tag_two_writers_set_apart_is_a_conflict_until_one_forces_it(tmp_path: Path,
                                                                       two_nodes: dict[str, Any]) -> None:
    remote = bare_remote(tmp_path / "team.git")
    alice = engineer(tmp_path, "alice", two_nodes, str(remote))
    bob = engineer(tmp_path, "bob", two_nodes, str(remote))
    ok(alice, "pull", "ct200")
    ok(bob, "pull", "ct129")
    ok(alice, "tag", "v1", "ct200")
    ok(bob, "tag", "v1", "ct129")
    ok(alice, "sync")
    conflict = snap(bob, "sync")
    assert conflict.code == 1 and "conflict: tag v1" in conflict.err and "alice@lab" in conflict.err, conflict
    assert snap(alice, "sync").code == 1  # alice's store sees it too
    for config in (alice, bob):
        one_error(snap(config, "diff", "v1", "ct200"), 2, "alice@lab", "bob@lab")
    assert snap(alice, "tag", "v1", "ct200").code == 2  # not without --force
    ok(alice, "tag", "--force", "v1", "ct129@latest")  # bob's snapshot, for the team
    ok(alice, "sync")
    ok(bob, "sync")
    ids = [ok(config, "show", "v1", "--json").out for config in (alice, bob)]
    assert ids[0] == ids[1] and '"node": "ct129"' in ids[0]
    # A tag deleted by one writer is gone for the team, though the other still holds its ref.
    ok(bob, "tag", "-d", "v1")
    ok(bob, "sync")
    ok(alice, "sync")
    assert "refs/snapver/alice@lab/tags/v1" in remote_refs(remote)
    for config in (alice, bob):
        assert "v1" not in ok(config, "tag", "--list").out

    # A push bob's store began and never finished (its record left "started", as a killed
    # push leaves it): alice sees it once both synced, with who left it.
    meta = json.dumps({"v": 1, "kind": "push", "action": "push", "state": "started", "patch": "fix",
                       "node": "ct129", "writer": "bob@lab"})
    git = ["git", "--git-dir", str(bob.parent / "snapshots")]
    record = subprocess.run([*git, "-c", "user.name=t", "-c", "user.email=t@t", "commit-tree",
                             "refs/heads/nodes/ct129^{tree}", "-m", f"push fix to ct129\n\nsnapver-meta: {meta}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([*git, "update-ref", "refs/heads/pushes/ct129", record], check=True)
    ok(bob, "sync")
    ok(alice, "sync")
    status = snap(alice, "status", "ct129")
    assert "ct129: INTERRUPTED push fix (" in status.out and " by bob@lab)" in status.out, status


def test_push_refuses_a_patch_whose_newest_version_it_has_not_seen(tmp_path: Path,
                                                                  two_nodes: dict[str, Any]) -> None:
    remote = bare_remote(tmp_path / "team.git")
    alice = engineer(tmp_path, "alice", two_nodes, str(remote))
    bob = engineer(tmp_path, "bob", two_nodes, str(remote))
    diff = tmp_path / "fix.diff"
    diff.write_text(f"--- a/{SRT}/server_args.py\n+++ b/{SRT}/server_args.py\n@@ -1 +1 @@\n"
                    "-port = 30000\n+port = 30001\n")
    ok(alice, "pull", "ct200")
    ok(alice, "patch", "import", "port", diff, "--base", "ct200", "--nodes", "ct129")
    ok(alice, "sync")
    ok(bob, "sync")
    # Bob edits the patch in his store and publishes it; alice has not synced since.
    checkout = Path(ok(bob, "patch", "new", "port").out.strip().splitlines()[-1].split()[-1])
    (checkout / f"{SRT}/server_args.py").write_text("port = 30002\n")
    ok(bob, "patch", "save", "port", "-m", "bob's port")
    ok(bob, "sync")
    refused = snap(alice, "push", "port", "--dry-run")
    assert refused.code == 1 and "bob@lab" in refused.err and "sync" in refused.err, refused
    # Synced, alice's store sees bob's version, which contains hers: it is the patch now.
    ok(alice, "sync")
    planned = ok(alice, "push", "port", "--dry-run")
    assert "ct129" in planned.out
    assert ok(alice, "patch", "export", "port").out.count("+port = 30002") == 1
    # Edited apart in both stores: two versions, both in the history; push refuses.
    checkout = Path(ok(alice, "patch", "new", "port").out.strip().splitlines()[-1].split()[-1])
    (checkout / f"{SRT}/server_args.py").write_text("port = 30003\n")
    ok(alice, "patch", "save", "port", "-m", "alice's port")
    (Path(str(checkout).replace("alice", "bob")) / f"{SRT}/server_args.py").write_text("port = 30004\n")
    ok(bob, "patch", "save", "port", "-m", "bob's second")
    ok(alice, "sync")
    ok(bob, "sync")
    ok(alice, "sync")
    for config in (alice, bob):
        history = ok(config, "patch", "show", "port", "--history").out
        assert "alice's port" in history and "bob's second" in history and "by alice@lab" in history, history
        diverged = snap(config, "push", "port", "--dry-run")
        assert diverged.code == 1 and "does not include" in diverged.err, diverged


def test_sync_over_ssh_and_the_bad_remotes(tmp_path: Path, two_nodes: dict[str, Any], sshd: Any) -> None:
    remote = bare_remote(tmp_path / "team.git")
    ssh = (f"ssh -i {sshd.identity_file} -o UserKnownHostsFile={sshd.known_hosts} -o StrictHostKeyChecking=yes "
           "-o IdentitiesOnly=yes -o BatchMode=yes")
    os.environ["GIT_SSH_COMMAND"] = ssh  # the user's git/SSH setup (isolated_env restores the environment)
    url = f"ssh://root@{sshd.addresses['ct200']}:{sshd.port}{remote}"
    alice = engineer(tmp_path, "alice", two_nodes, url)
    bob = engineer(tmp_path, "bob", two_nodes, url, sync="auto")
    ok(alice, "pull", "ct200", "ct129")
    ok(alice, "sync")
    assert "up to date" in ok(alice, "sync").out  # unchanged: one ls-remote, nothing sent
    # Bob syncs automatically before reading.
    assert ok(bob, "log").out.count("ct1") + ok(bob, "log").out.count("ct2") >= 2
    assert "refs/snapver/alice@lab/nodes/ct129" in remote_refs(remote)
    fsck(remote)

    # A remote nobody listens at: exit 3, one line; with sync = "auto", a warning only.
    dead = f"ssh://root@{sshd.addresses['ct200']}:1{remote}"
    offline = engineer(tmp_path, "carol", two_nodes, dead, sync="auto")
    one_error(snap(offline, "sync"), 3, "cannot reach the remote")
    reading = snap(offline, "log")
    assert reading.code == 0 and "warning: not synced" in reading.err, reading
    # A repository of some project, not a snapver store: refused, nothing published.
    project = bare_remote(tmp_path / "project.git")
    empty_tree = "4b825dc642cb6eb9a060e54bf8d69288fbee4904"
    subprocess.run(["git", "--git-dir", str(project), "mktree"], input=b"", check=True, capture_output=True)
    commit = subprocess.run(["git", "--git-dir", str(project), "-c", "user.name=x", "-c", "user.email=x@x",
                             "commit-tree", empty_tree, "-m", "a project"], check=True, capture_output=True,
                            text=True).stdout.strip()
    subprocess.run(["git", "--git-dir", str(project), "update-ref", "refs/heads/main", commit], check=True)
    wrong = engineer(tmp_path, "dave", two_nodes, str(project))
    ok(wrong, "pull", "ct200")
    one_error(snap(wrong, "sync"), 3, "not a snapver store")
    assert list(remote_refs(project)) == ["refs/heads/main"]
    # A second store claiming alice's writer id: refused, the remote keeps alice's refs.
    twin = engineer(tmp_path, "eve", two_nodes, url)
    set_writer(twin, "alice@lab")
    before = remote_refs(remote)
    one_error(snap(twin, "sync"), 3, "already publishes")
    assert remote_refs(remote) == before
    # Even once it believes it synced before: its branches do not contain alice's, refused.
    subprocess.run(["git", "--git-dir", str(twin.parent / "snapshots"), "config", "snapver.synced", "true"],
                   check=True)
    ok(twin, "pull", "ct200")
    one_error(snap(twin, "sync"), 3, "already publishes", "did not publish")
    assert remote_refs(remote) == before
    # A remote whose hook refuses the push: exit 3, nothing published; the next sync completes.
    hook = remote / "hooks" / "pre-receive"
    hook.write_text("#!/bin/sh\necho 'no permission' >&2\nexit 1\n")
    hook.chmod(0o755)
    ok(alice, "tag", "v2", "ct129")
    one_error(snap(alice, "sync"), 3, "refused the push")
    assert "refs/snapver/alice@lab/tags/v2" not in remote_refs(remote)
    hook.unlink()
    ok(alice, "sync")
    assert "refs/snapver/alice@lab/tags/v2" in remote_refs(remote)
    # No remote configured: a config error; a locked store: exit 4.
    plain = tmp_path / "plain" / ".snapver"
    plain.parent.mkdir()
    plain.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": two_nodes}))
    one_error(snap(plain, "sync"), 2, "store.remote")
    from snapver.store.lock import store_lock

    with store_lock(alice.parent / "snapshots"):
        os.environ["SNAPVER_LOCK_WAIT"] = "0.2"
        one_error(snap(alice, "sync"), 4, "locked")


def test_a_pull_compares_with_the_newest_snapshot_of_the_node_by_any_writer(tmp_path: Path,
                                                                          two_nodes: dict[str, Any]) -> None:
    remote = bare_remote(tmp_path / "team.git")
    alice = engineer(tmp_path, "alice", two_nodes, str(remote))
    bob = engineer(tmp_path, "bob", two_nodes, str(remote))
    ct200, ct129 = (Path(two_nodes[node]["site_packages"]) for node in ("ct200", "ct129"))

    def pulled(config: Path, node: str) -> dict[str, Any]:
        return json.loads(ok(config, "pull", node, "--json").out)["nodes"][0]

    def parents(config: Path, commit: str) -> list[str]:
        return git_rev(config, f"{commit}^@").split() if git_rev(config, f"{commit}^@") else []

    ok(alice, "pull", "ct200", "ct129")
    ok(bob, "pull", "ct200")  # the same tree, before bob ever synced: his own root snapshot
    ok(alice, "sync")
    ok(bob, "sync")
    bob_first = own_head(bob, "ct200")
    # ct200 changes; alice's snapshot of it is the newest, and the live tree is as it says.
    (ct200 / f"{SRT}/server_args.py").write_text("port = 30001\n")
    alices = pulled(alice, "ct200")["snapshot"]
    ok(alice, "sync")
    ok(bob, "sync")
    assert snap(bob, "diff", "-q", "ct200").code == 0
    # Bob's pull: unchanged since alice's snapshot; nothing recorded, his branch stays.
    again = pulled(bob, "ct200")
    assert again["snapshot"] is None and again["unchanged_since"] == alices and again["fetched_files"] == 0, again
    assert ok(bob, "pull", "ct200").out.startswith(f"ct200: unchanged since {alices[:10]}")
    assert own_head(bob, "ct200") == bob_first
    # Changed again: one file changed from alice's snapshot, which is the new one's first
    # parent; bob's own head its second (his branch only moves forward).
    (ct200 / f"{SRT}/server_args.py").write_text("port = 30002\n")
    bobs = pulled(bob, "ct200")
    assert bobs["changed"] == 1 and bobs["fetched_files"] == 1, bobs
    assert own_head(bob, "ct200") == bobs["snapshot"] and parents(bob, bobs["snapshot"]) == [alices, bob_first]
    # The log lists every snapshot once, newest first; ~N counts in it.
    log = ok(bob, "log", "ct200").out.splitlines()
    assert [line[:10] for line in log[:2]] == [bobs["snapshot"][:10], alices[:10]] and len(log) == 4, log
    assert "1 changed" in log[0] and "by bob@lab" in log[0], log
    assert json.loads(ok(bob, "show", "ct200~1", "--json").out)["id"] == alices
    assert json.loads(ok(bob, "show", "ct200~2", "--json").out)["id"] == bob_first

    # Bob's first pull of ct129, which alice pulled: not a root commit, nothing sent twice.
    assert pulled(bob, "ct129")["unchanged_since"] == git_rev(alice, "refs/heads/nodes/ct129")
    (ct129 / f"{SRT}/server_args.py").write_text("port = 30003\n")
    first = pulled(bob, "ct129")
    assert first["changed"] == 1 and first["fetched_files"] == 1, first
    assert first["fetched_bytes"] == len("port = 30003\n"), first
    assert parents(bob, first["snapshot"]) == [git_rev(alice, "refs/heads/nodes/ct129")]

    # Alice, synced, finds both nodes as bob's snapshots say.
    ok(bob, "sync")
    ok(alice, "sync")
    for node, commit in (("ct200", bobs["snapshot"]), ("ct129", first["snapshot"])):
        assert pulled(alice, node)["unchanged_since"] == commit
    assert ok(alice, "log").out == ok(bob, "log").out
    fsck(remote)


# -- trust: what a teammate's namespace may and may not make this store do ----------------
EVIL = "import os; os.system('touch /tmp/owned')\n"
DFLASH = f"{SRT}/speculative/dflash_worker.py"


def git_out(config: Path, *args: str, input: str | None = None) -> str:  # noqa: A002 - as subprocess.run
    return subprocess.run(["git", "--git-dir", str(config.parent / "snapshots"), "-c", "user.name=m",
                           "-c", "user.email=m@m", *args], input=input, check=True, capture_output=True,
                          text=True).stdout.strip()


def forge_push_record(mallory: Path, node: str, claimed: str, bait: str) -> str:
    """In mallory's store, a push record of ``node`` claiming to be ``claimed``'s push, its
    restore point ``bait`` (a snapshot only this record reaches, as its second parent) and its
    files the node's dflash worker as the team's newest snapshot holds it; published on the
    next sync under mallory's own namespace. Returns the record."""
    newest = git_rev(mallory, f"refs/remotes/team/bob@lab/nodes/{node}")
    genuine = git_rev(mallory, f"refs/remotes/team/bob@lab/pushes/{node}")
    meta = json.dumps({"v": 1, "kind": "push", "action": "push", "state": "done", "patch": "port", "node": node,
                       "writer": claimed, "push_id": "f0f0f0f0f0f0f0f0", "before": bait, "restore": bait,
                       "after": newest, "patch_commit": newest, "files": {"write": [DFLASH]},
                       "time_ns": time.time_ns()})  # the newest record, to the nanosecond
    record = git_out(mallory, "commit-tree", f"{newest}^{{tree}}", "-p", genuine, "-p", bait,
                     "-m", f"push port to {node}: done\n\nsnapver-meta: {meta}")
    git_out(mallory, "update-ref", f"refs/heads/pushes/{node}", record)
    return record


@pytest.mark.parametrize("claimed", ["bob@lab", "mallory@lab"])
def test_a_forged_push_record_in_a_third_namespace_never_deploys_its_snapshot(
        tmp_path: Path, make_site_packages: Callable[..., Path], ssh_node: Callable[..., dict[str, Any]],
        local_node: Callable[..., dict[str, Any]], claimed: str) -> None:
    site = make_site_packages("ct129", files=FILES)
    bait_site = make_site_packages("bait", files={**FILES, DFLASH: EVIL})
    nodes = {"ct129": ssh_node("ct129", site)}
    remote = bare_remote(tmp_path / "team.git")
    alice = engineer(tmp_path, "alice", nodes, str(remote))
    bob = engineer(tmp_path, "bob", nodes, str(remote))
    mallory = engineer(tmp_path, "mallory", {**nodes, "bait": local_node(bait_site)}, str(remote))
    diff = tmp_path / "port.diff"
    diff.write_text(f"--- a/{SRT}/server_args.py\n+++ b/{SRT}/server_args.py\n@@ -1 +1 @@\n"
                    "-port = 30000\n+port = 30001\n")
    # Bob pushes a real patch to ct129 and publishes it.
    ok(bob, "pull", "ct129")
    ok(bob, "patch", "import", "port", diff, "--base", "ct129", "--nodes", "ct129")
    ok(bob, "push", "port", "ct129", "--yes")
    ok(bob, "sync")
    # Mallory snapshots a tree holding the payload, hides it (no branch names it, so `log` never
    # shows it) and forges a newer record of ct129 that restores it, published as hers.
    ok(mallory, "sync")
    ok(mallory, "pull", "bait")
    bait = own_head(mallory, "bait")
    git_out(mallory, "update-ref", "-d", "refs/heads/nodes/bait")
    forged = forge_push_record(mallory, "ct129", claimed, bait)
    ok(mallory, "sync")
    assert remote_refs(remote)["refs/snapver/mallory@lab/pushes/ct129"] == forged

    ok(alice, "sync")
    assert bait[:10] not in ok(alice, "log").out
    planned = ok(alice, "rollback", "ct129", "--dry-run")
    assert bait[:10] not in planned.out and "by 'bob@lab'" in planned.out, planned
    done = ok(alice, "rollback", "ct129", "--yes")
    assert (site / DFLASH).read_text() == FILES[DFLASH], done
    # What is undone is bob's real push: the port is back, the payload nowhere.
    assert (site / f"{SRT}/server_args.py").read_text() == FILES[f"{SRT}/server_args.py"], done
    said = [line for line in (done.out + done.err).splitlines() if "ignored push record" in line]
    assert len(said) == 1 and forged[:10] in said[0] and "'mallory@lab'" in said[0], done


def wait_until(condition: Callable[[], object], what: str, deadline: float = 60.0) -> None:
    end = time.monotonic() + deadline
    while not condition():
        assert time.monotonic() < end, f"no {what} after {deadline} s"
        time.sleep(0.01)


def test_a_sync_killed_in_its_first_publish_is_recognised_as_ours_next_time(tmp_path: Path,
                                                                           two_nodes: dict[str, Any]) -> None:
    import signal

    remote = bare_remote(tmp_path / "team.git")
    alice = engineer(tmp_path, "alice", two_nodes, str(remote))
    ok(alice, "pull", "ct200", "ct129")
    ok(alice, "tag", "may22", "ct200")
    # The remote takes the push, then holds it open until told: snapver is killed meanwhile,
    # its `git push` carries on alone and completes.
    hook = remote / "hooks" / "post-receive"
    took, release = tmp_path / "took", tmp_path / "release"
    hook.write_text(f"#!/bin/sh\ntouch {took}\nwhile [ ! -e {release} ]; do sleep 0.01; done\n")
    hook.chmod(0o755)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    syncing = subprocess.Popen([sys.executable, "-m", "snapver", "--config", str(alice), "sync"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(took.exists, "push reaching the remote")
        os.kill(syncing.pid, signal.SIGKILL)
        syncing.wait(timeout=60)
    finally:
        release.touch()  # the hook never outlives the test
    published = "refs/snapver/alice@lab/nodes/ct200"
    wait_until(lambda: published in remote_refs(remote), "published ref")
    hook.unlink()
    before = remote_refs(remote)
    assert before[published] == own_head(alice, "ct200")

    # The next sync knows its own history there: no "another store", nothing lost.
    again = snap(alice, "sync")
    assert again.code == 0 and "another store" not in again.err + again.out, again
    ok(alice, "pull", "ct200")  # and it goes on publishing as before
    (Path(two_nodes["ct129"]["site_packages"]) / f"{SRT}/server_args.py").write_text("port = 30009\n")
    ok(alice, "pull", "ct129")
    ok(alice, "sync")
    after = remote_refs(remote)
    assert after["refs/snapver/alice@lab/nodes/ct129"] == own_head(alice, "ct129")
    assert after["refs/snapver/alice@lab/tags/may22"] == before["refs/snapver/alice@lab/tags/may22"]
    fsck(remote)


def test_writer_ids_that_prefix_each_other_are_never_confused(tmp_path: Path, two_nodes: dict[str, Any]) -> None:
    remote = bare_remote(tmp_path / "team.git")
    bob2 = engineer(tmp_path, "bob2", two_nodes, str(remote))
    bob = engineer(tmp_path, "bob", two_nodes, str(remote))
    set_writer(bob2, "bob2")
    set_writer(bob, "bob")  # a prefix of the other, to the letter
    ok(bob2, "pull", "ct200")
    ok(bob2, "tag", "v1", "ct200")
    ok(bob2, "sync")
    # bob's first sync: bob2's refs are someone else's, not bob's published elsewhere.
    first = snap(bob, "sync")
    assert first.code == 0 and "fetched from bob2" in first.out, first
    (Path(two_nodes["ct200"]["site_packages"]) / f"{SRT}/server_args.py").write_text("port = 30001\n")
    ok(bob, "pull", "ct200")
    ok(bob, "tag", "v2", "ct200")
    ok(bob, "sync")
    ok(bob2, "sync")
    published = remote_refs(remote)
    assert published["refs/snapver/bob/nodes/ct200"] == own_head(bob, "ct200")
    assert published["refs/snapver/bob2/nodes/ct200"] == own_head(bob2, "ct200")
    # Each store reads the other's snapshot as the other's: bob's is the newest, by bob.
    for config in (bob, bob2):
        log = ok(config, "log", "ct200").out.splitlines()
        assert log[0].startswith(own_head(bob, "ct200")[:10]) and log[0].endswith(" by bob"), log
        assert log[-1].endswith(" by bob2"), log
    fsck(remote)


def test_refs_in_our_namespace_this_store_did_not_publish_are_reported_then_reclaimed(
        tmp_path: Path, two_nodes: dict[str, Any]) -> None:
    remote = bare_remote(tmp_path / "team.git")
    alice = engineer(tmp_path, "alice", two_nodes, str(remote))
    ok(alice, "pull", "ct200")
    ok(alice, "sync")
    # Another store, given alice's id by mistake, publishes ct129 (alice never pulled it).
    twin = engineer(tmp_path, "twin", two_nodes, str(remote))
    set_writer(twin, "alice@lab")
    subprocess.run(["git", "--git-dir", str(twin.parent / "snapshots"), "config", "snapver.synced", "true"],
                   check=True)
    ok(twin, "pull", "ct129")
    subprocess.run(["git", "--git-dir", str(twin.parent / "snapshots"), "push", "-q", str(remote),
                    "refs/heads/nodes/ct129:refs/snapver/alice@lab/nodes/ct129"], check=True)
    before = remote_refs(remote)
    ok(alice, "pull", "ct129")  # alice's own, another commit
    refused = snap(alice, "sync")
    one_error(refused, 3, "'alice@lab'", "'nodes/ct129'", "did not publish")
    assert "--reclaim" in refused.err, refused
    assert remote_refs(remote) == before
    assert "refs/remotes/team/alice@lab/nodes/ct129" not in subprocess.run(
        ["git", "--git-dir", str(alice.parent / "snapshots"), "for-each-ref"], capture_output=True, text=True,
        check=True).stdout  # not adopted
    reclaimed = ok(alice, "sync", "--reclaim")
    assert "reclaimed 1" in reclaimed.out, reclaimed
    assert remote_refs(remote)["refs/snapver/alice@lab/nodes/ct129"] == own_head(alice, "ct129")
    ok(alice, "sync")
    fsck(remote)


def date_ahead(config: Path, ref: str, seconds: int) -> str:
    """Rewrite the commit at ``ref`` in that engineer's store as a clock ``seconds`` ahead would
    have written it (commit times and the meta's time and time_ns; tree, parents unchanged)."""
    git = ["git", "--git-dir", str(config.parent / "snapshots")]
    raw = subprocess.run([*git, "cat-file", "commit", ref], check=True, capture_output=True).stdout.decode()
    head, _, message = raw.partition("\n\n")
    head = re.sub(r"^((?:author|committer) .*> )(\d+)", lambda m: m.group(1) + str(int(m.group(2)) + seconds),
                  head, flags=re.M)
    subject, _, meta_line = message.rpartition("snapver-meta: ")
    meta = json.loads(meta_line)
    meta["time_ns"] += seconds * 1_000_000_000
    from datetime import datetime, timedelta

    meta["time"] = (datetime.fromisoformat(meta["time"]) + timedelta(seconds=seconds)).isoformat()
    text = head + "\n\n" + subject + "snapver-meta: " + json.dumps(meta) + "\n"
    commit = subprocess.run([*git, "hash-object", "-t", "commit", "-w", "--stdin"], input=text.encode(),
                            check=True, capture_output=True).stdout.decode().strip()
    subprocess.run([*git, "update-ref", ref, commit], check=True)
    return commit


def test_a_teammate_s_clock_a_day_ahead_does_not_pin_the_newest_snapshot(tmp_path: Path,
                                                                        two_nodes: dict[str, Any]) -> None:
    remote = bare_remote(tmp_path / "team.git")
    alice = engineer(tmp_path, "alice", two_nodes, str(remote))
    bob = engineer(tmp_path, "bob", two_nodes, str(remote))
    args = Path(two_nodes["ct200"]["site_packages"]) / f"{SRT}/server_args.py"
    ok(alice, "pull", "ct200")
    first = own_head(alice, "ct200")
    ok(alice, "sync")
    ok(bob, "sync")
    args.write_text("port = 30001\n")
    ok(bob, "pull", "ct200")
    ahead = date_ahead(bob, "refs/heads/nodes/ct200", 86400)  # bob's clock: a day ahead
    ok(bob, "sync")
    synced = ok(alice, "sync")
    assert "future" in synced.err and ahead[:10] in synced.err and "bob@lab" in synced.err, synced
    # Alice's next snapshot is taken on top of bob's (the newest she saw): it is the newest.
    args.write_text("port = 30002\n")
    second = json.loads(ok(alice, "pull", "ct200", "--json").out)["nodes"][0]
    assert second["changed"] == 1, second
    again = json.loads(ok(alice, "pull", "ct200", "--json").out)["nodes"][0]
    assert again["snapshot"] is None and again["unchanged_since"] == second["snapshot"], again
    assert json.loads(ok(alice, "show", "ct200@latest", "--json").out)["id"] == second["snapshot"]
    log = ok(alice, "log", "ct200").out.splitlines()
    assert [line[:10] for line in log] == [second["snapshot"][:10], ahead[:10], first[:10]], log
    assert json.loads(ok(alice, "show", "ct200~1", "--json").out)["id"] == ahead
    # Bob, synced, agrees.
    ok(alice, "sync")
    ok(bob, "sync")
    assert json.loads(ok(bob, "pull", "ct200", "--json").out)["nodes"][0]["unchanged_since"] == second["snapshot"]


def test_a_tag_forced_back_to_a_value_it_overruled_is_that_value_and_sync_says_who_moved_it(
        tmp_path: Path, two_nodes: dict[str, Any]) -> None:
    remote = bare_remote(tmp_path / "team.git")
    alice = engineer(tmp_path, "alice", two_nodes, str(remote))
    bob = engineer(tmp_path, "bob", two_nodes, str(remote))
    ok(alice, "pull", "ct200", "ct129")
    first, second = own_head(alice, "ct200"), own_head(alice, "ct129")
    ok(alice, "tag", "prod", "ct200")
    ok(alice, "sync")
    ok(bob, "sync")
    ok(bob, "tag", "--force", "prod", "ct129")  # bob moves the team's tag
    ok(bob, "sync")
    moved = ok(alice, "sync")
    assert f"tag prod moved {first[:10]} → {second[:10]} by 'bob@lab'" in moved.out, moved
    ok(alice, "tag", "--force", "prod", first)  # and alice forces it back to the value bob overruled
    ok(alice, "sync")
    back = ok(bob, "sync")
    assert f"tag prod moved {second[:10]} → {first[:10]} by 'alice@lab'" in back.out, back
    for config in (alice, bob):
        assert json.loads(ok(config, "show", "prod", "--json").out)["id"] == first
        assert re.search(rf"^prod\s+{first[:10]}", ok(config, "tag", "--list").out, re.M), config
    assert "moved" not in ok(alice, "sync").out  # said once


@pytest.fixture
def small_disk(tmp_path: Path) -> Any:
    """An 8 MB tmpfs; unmounted afterwards, whatever happened."""
    with tmpfs(tmp_path / "disk", "8m") as mount_point:
        yield mount_point


def test_a_sync_that_fills_the_disk_leaves_no_temporary_pack(tmp_path: Path, two_nodes: dict[str, Any],
                                                             make_site_packages: Callable[..., Path],
                                                             local_node: Callable[..., dict[str, Any]],
                                                             small_disk: Path) -> None:
    remote = bare_remote(tmp_path / "team.git")
    big = make_site_packages("big", files={**FILES, f"{SRT}/weights.bin": os.urandom(4 << 20)})
    nodes = {**two_nodes, "big": local_node(big)}
    alice = engineer(tmp_path, "alice", nodes, str(remote), path=str(small_disk / "snapshots"))
    bob = engineer(tmp_path, "bob", nodes, str(remote))
    ok(alice, "pull", "ct200")
    ok(alice, "sync")
    ok(bob, "pull", "big")
    ok(bob, "sync")
    # Alice's disk has 2 MB left: bob's 4 MB snapshot does not fit.
    filler = small_disk / "filler"
    with filler.open("wb") as out:
        while os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize > 2 << 20:
            out.write(b"\0" * (64 << 10))
    before = remote_refs(small_disk / "snapshots")
    full = snap(alice, "sync")
    one_error(full, 4, "disk is full")
    left = [str(path) for path in (small_disk / "snapshots" / "objects").rglob("tmp_*")]
    assert not left, left  # the half-received objects removed: the space is back
    assert remote_refs(small_disk / "snapshots") == before
    # 3 MB freed: with the failed fetch's leftovers gone, 5 MB is room enough.
    os.truncate(filler, max(0, filler.stat().st_size - (3 << 20)))
    ok(alice, "sync")
    assert ok(alice, "show", "big@latest", f"{SRT}/__init__.py").out == ""


def replace_in_tree(config: Path, tree: str, path: str, blob: str) -> str:
    """The tree ``tree`` with the blob at ``path`` replaced by ``blob``, built with
    ``ls-tree`` and ``mktree`` a folder at a time (nothing of snapver's)."""
    head, _, rest = path.partition("/")
    rows = []
    for row in git_out(config, "ls-tree", tree).splitlines():
        mode_kind_oid, _, name = row.partition("\t")
        mode, kind, oid = mode_kind_oid.split(" ")
        if name == head:
            oid = replace_in_tree(config, oid, rest, blob) if rest else blob
        rows.append(f"{mode} {kind} {oid}\t{name}")
    return git_out(config, "mktree", input="\n".join(rows) + "\n")


def forge_snapshot(config: Path, node: str, how: str) -> str:
    """On top of the node's newest snapshot in that store, a snapshot commit (same metadata)
    whose manifest and tree disagree: ``tree``: the dflash worker's blob swapped in the tree,
    the manifest as it was; ``manifest``: the manifest naming, for that file, a blob that is
    in no store, the tree as it was. The node's branch moved to it; returns it."""
    head = own_head(config, node)
    tree = git_out(config, "rev-parse", f"{head}^{{tree}}")
    if how == "tree":
        payload = git_out(config, "hash-object", "-w", "--stdin", input=EVIL)
        forged_tree = replace_in_tree(config, tree, DFLASH, payload)
    else:
        real = git_out(config, "rev-parse", f"{head}:{DFLASH}")
        manifest = git_out(config, "cat-file", "blob", f"{head}:.snapver/manifest") + "\n"
        assert real in manifest
        manifest_blob = git_out(config, "hash-object", "-w", "--stdin", input=manifest.replace(real, "e" * 40))
        forged_tree = replace_in_tree(config, tree, ".snapver/manifest", manifest_blob)
    message = git_out(config, "log", "-1", "--format=%B", head)
    forged = git_out(config, "commit-tree", forged_tree, "-p", head, "-m", message)
    git_out(config, "update-ref", f"refs/heads/nodes/{node}", forged, head)
    return forged


@pytest.mark.parametrize("how", ["tree", "manifest"])
def test_sync_refuses_a_writer_whose_snapshot_manifest_and_tree_disagree(tmp_path: Path, two_nodes: dict[str, Any],
                                                                         how: str) -> None:
    remote = bare_remote(tmp_path / "team.git")
    alice = engineer(tmp_path, "alice", two_nodes, str(remote))
    bob = engineer(tmp_path, "bob", two_nodes, str(remote))
    mallory = engineer(tmp_path, "mallory", two_nodes, str(remote))
    ok(mallory, "pull", "ct200")
    ok(mallory, "sync")
    ok(alice, "sync")
    mirror_before = {name: oid for name, oid in remote_refs(tmp_path / "alice" / "snapshots").items()
                     if name.startswith("refs/remotes/team/mallory@lab/")}
    assert mirror_before
    forged = forge_snapshot(mallory, "ct200", how)
    ok(mallory, "pull", "ct129")  # a genuine snapshot of mallory's, published with the forgery
    ok(mallory, "sync")
    assert remote_refs(remote)["refs/snapver/mallory@lab/nodes/ct200"] == forged
    ok(bob, "pull", "ct129")
    one_error(snap(bob, "sync"), 3, "'mallory@lab'", forged[:10])  # refused, yet bob's own published
    assert remote_refs(remote)["refs/snapver/bob@lab/nodes/ct129"] == own_head(bob, "ct129")

    refused = snap(alice, "sync")
    one_error(refused, 3, "'mallory@lab'", forged[:10])
    after = remote_refs(tmp_path / "alice" / "snapshots")
    # Nothing of mallory's moved (not even her genuine ct129 snapshot); bob's was taken.
    assert {name: oid for name, oid in after.items() if name.startswith("refs/remotes/team/mallory@lab/")} \
        == mirror_before
    assert after["refs/remotes/team/bob@lab/nodes/ct129"] == remote_refs(remote)["refs/snapver/bob@lab/nodes/ct129"]
    assert not [name for name in after if name.startswith("refs/snapver/")]
    assert forged[:10] not in ok(alice, "log", "ct200").out
    assert ok(alice, "show", "ct200@latest", DFLASH).out == FILES[DFLASH]
    assert json.loads(ok(alice, "fsck", "--json").out)["ok"]
