"""log and show say what made each snapshot (pull, push NAME, rollback), on a real sshd node.

The history is made for real (pull, hot-fix, pull, push, rollback); what made each
snapshot is checked against the store read with git.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from helpers import toml_dumps
from snapver_inproc import run_inproc

A = "sglang/srt/a.py"
B = "sglang/srt/b.py"


def git(store: Path, *args: str, input: str | None = None) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin"}
    return subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True, text=True, env=env,
                          input=input, check=True).stdout.strip()


def test_log_and_show_say_what_made_each_snapshot(make_site_packages, ssh_node, tmp_path: Path) -> None:
    site = make_site_packages("ct200", files={A: "a = 1\n", B: "b = 1\n"})
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": {"ct200": ssh_node("ct200", site)}}))
    store = tmp_path / "snapshots"

    def cli(*args: object):
        result = run_inproc("--config", config, *args)
        assert result.code == 0, result
        return result

    cli("pull")
    (site / A).write_text("a = 2  # hot-fix\n")
    cli("pull", "-m", "after the hot-fix")
    diff_file = tmp_path / "fix-b.diff"
    diff_file.write_text(f"--- a/{B}\n+++ b/{B}\n@@ -1 +1 @@\n-b = 1\n+b = 2\n")
    cli("patch", "import", "fix-b", diff_file, "--base", "ct200")
    cli("push", "fix-b", "ct200", "--yes")
    cli("rollback", "ct200", "--yes")
    history = git(store, "rev-list", "refs/heads/nodes/ct200").split()
    assert len(history) == 4  # pull, pull, push's after (its before is the second pull), rollback's after
    snapshots = json.loads(cli("log", "--json").out)["snapshots"]
    assert [s["id"] for s in snapshots] == history
    assert [(s["event"], s["patch"]) for s in snapshots] == [
        ("rollback", None), ("push", "fix-b"), ("pull", None), ("pull", None)]
    assert snapshots[2]["message"] == "after the hot-fix"
    lines = cli("log", "--oneline").out.splitlines()
    assert [line.split()[0] for line in lines] == [h[:10] for h in history]
    assert [line.split()[4:6] for line in lines[:2]] == [["rollback"], ["push", "fix-b"]]
    assert lines[2].endswith("ct200 pull after the hot-fix")
    full = cli("log").out.splitlines()
    assert "  push fix-b  " in full[1] and "2 files, 1 changed" in full[1]
    # --since: a day, or a moment; nothing after now; a bad date is exit 2.
    assert len(json.loads(cli("log", "--json", "--since", "2000-01-01").out)["snapshots"]) == 4
    assert json.loads(cli("log", "--json", "--since", "2999-01-01").out)["snapshots"] == []
    stamps = {h: int(git(store, "log", "-1", "--format=%ct", h)) for h in history}
    second = git(store, "log", "-1", "--format=%cI", history[2])
    since = [s["id"] for s in json.loads(cli("log", "--json", "--since", second).out)["snapshots"]]
    assert since == [h for h in history if stamps[h] >= stamps[history[2]]] and since[:3] == history[:3]
    assert len(json.loads(cli("log", "--json", "-n", "1", "--since", second).out)["snapshots"]) == 1
    bad = run_inproc("--config", config, "log", "--since", "yesterday-ish")
    assert bad.code == 2 and "--since 'yesterday-ish': not a date" in bad.err
    # show: what made it, and the files changed from its parent (diff --stat style).
    shown = cli("show", history[1][:6]).out
    assert "made by:       push fix-b" in shown
    assert f"changed from {history[2][:10]}:" in shown
    assert f" {B} | 2 +-" in shown and " 1 file changed, 1 insertion(+), 1 deletion(-)" in shown
    first = cli("show", history[3]).out
    assert "made by:       pull" in first and "first snapshot of ct200: 2 files" in first
    document = json.loads(cli("show", "--json", history[0]).out)
    assert document["event"] == "rollback" and document["parent"] == history[1]
    assert [(c["path"], c["status"]) for c in document["changes"]] == [(B, "M")]


def test_snapshots_from_before_events_take_theirs_from_push_records(make_site_packages, ssh_node,
                                                                     tmp_path: Path) -> None:
    """A store written before snapshots said what made them: a push record naming a
    snapshot as its ``after`` says it."""
    site = make_site_packages("ct200", files={A: "a = 1\n"})
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": {"ct200": ssh_node("ct200", site)}}))
    store = tmp_path / "snapshots"
    assert run_inproc("--config", config, "pull").code == 0
    (site / A).write_text("a = 2\n")
    assert run_inproc("--config", config, "pull").code == 0
    head = git(store, "rev-parse", "refs/heads/nodes/ct200")
    parent = git(store, "rev-parse", "refs/heads/nodes/ct200~1")
    # Rewrite both snapshots' metadata as older snapvers wrote it: no "event".
    rewritten = []
    for commit, new_parent in ((parent, None), (head, "PARENT")):
        body = git(store, "log", "-1", "--format=%B", commit)
        prefix = "snapver-meta: "
        lines = []
        for line in body.splitlines():
            if line.startswith(prefix):
                meta = json.loads(line[len(prefix):])
                assert meta.pop("event") == "pull"
                line = prefix + json.dumps(meta)
            lines.append(line)
        args = ["commit-tree", f"{commit}^{{tree}}", "-m", "\n".join(lines)]
        if new_parent:
            args += ["-p", rewritten[0]]
        rewritten.append(git(store, *args))
    git(store, "update-ref", "refs/heads/nodes/ct200", rewritten[1])
    record_meta = json.dumps({"kind": "push", "action": "push", "patch": "old-fix", "state": "done",
                              "node": "ct200", "before": rewritten[0], "after": rewritten[1]})
    record = git(store, "commit-tree", f"{rewritten[1]}^{{tree}}", "-m", f"push old-fix\n\nsnapver-meta: {record_meta}")
    git(store, "update-ref", "refs/heads/pushes/ct200", record)
    snapshots = json.loads(run_inproc("--config", config, "log", "--json").out)["snapshots"]
    assert [(s["id"], s["event"], s["patch"]) for s in snapshots] == [
        (rewritten[1], "push", "old-fix"), (rewritten[0], "pull", None)]


def test_log_lists_snapshots_of_one_second_newest_first(make_site_packages, local_node, tmp_path: Path) -> None:
    """Snapshots of two nodes taken within one second (git's commit times are whole
    seconds) are listed by when each was taken, newest first, and `log -n 1` is the newest.
    (git's --date-order left such a tie in the order of the ids it was given: about half
    of the fresh stores below listed the first pull first.)"""
    sites = {name: make_site_packages(name, files={A: f"a = {name}\n"}) for name in ("n1", "n2")}
    nodes = {name: local_node(site) for name, site in sites.items()}
    for attempt in range(8):
        config = tmp_path / f"snapver{attempt}.toml"
        config.write_text(toml_dumps({"store": {"path": f"snapshots{attempt}"}, "nodes": nodes}))
        for name in ("n1", "n2"):
            assert run_inproc("--config", config, "pull", name).code == 0
        listed = json.loads(run_inproc("--config", config, "log", "--json").out)["snapshots"]
        assert [row["node"] for row in listed] == ["n2", "n1"], [(r["node"], r["meta"]["time_ns"]) for r in listed]
        newest = json.loads(run_inproc("--config", config, "log", "-n", "1", "--json").out)["snapshots"]
        assert [row["node"] for row in newest] == ["n2"]


def test_show_of_a_special_file_is_a_note_not_content(make_site_packages, local_node, write_config,
                                                     run_snapver) -> None:
    """`show SNAP sglang/srt/pipe` of a FIFO printed the store's record of it ("snapver:
    special file: fifo") on stdout, exit 0, as if it were the file's content. It is an error
    on stderr naming what the path is, exit 2, nothing on stdout; a file beside it shows."""
    import os

    site = make_site_packages("n", files={A: "a = 1\n"})
    os.mkfifo(site / "sglang/srt/pipe")
    write_config({"n": local_node(site)})
    assert run_snapver("pull", "n").code == 0
    for extra in ([], ["--json"]):
        shown = run_snapver("show", "n", "sglang/srt/pipe", *extra)
        lines = shown.err.splitlines()
        assert shown.code == 2 and shown.out == "", shown
        assert lines[0].startswith("snapver: error: ") and "fifo" in lines[0] and "no content" in lines[0], shown
        assert len(lines) == 2 and lines[1].startswith("hint: "), shown
    content = run_snapver("show", "n", A)
    assert (content.code, content.out) == (0, "a = 1\n"), content


def test_the_snapshot_a_rollback_takes_before_writing_is_labelled_so(make_site_packages, ssh_node,
                                                                     tmp_path: Path) -> None:
    """A hot-fix after a push: the rollback snapshots it before writing; log names that
    snapshot as the rollback's (it is not a `pull`)."""
    site = make_site_packages("ct200", files={A: "a = 1\n", B: "b = 1\n"})
    config = tmp_path / "snapver.toml"
    config.write_text(toml_dumps({"store": {"path": "snapshots"}, "nodes": {"ct200": ssh_node("ct200", site)}}))

    def cli(*args: object):
        result = run_inproc("--config", config, *args)
        assert result.code == 0, result
        return result

    cli("pull")
    diff_file = tmp_path / "fix-b.diff"
    diff_file.write_text(f"--- a/{B}\n+++ b/{B}\n@@ -1 +1 @@\n-b = 1\n+b = 2\n")
    cli("patch", "import", "fix-b", diff_file, "--base", "ct200")
    cli("push", "fix-b", "ct200", "--yes")
    (site / A).write_text("a = 2  # hot-fix after the push\n")
    cli("rollback", "ct200", "--yes")
    snapshots = json.loads(cli("log", "--json").out)["snapshots"]
    assert [(s["event"], s["patch"]) for s in snapshots] == [
        ("rollback", None), ("before-rollback", None), ("push", "fix-b"), ("pull", None)]
    lines = cli("log", "--oneline").out.splitlines()
    assert lines[1].split()[4:] == ["before-rollback"], lines
