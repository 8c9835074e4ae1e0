"""Every version of every patch stays reachable (issue 14, reproduction 6): a save or a
rebase is a new commit whose parents include the previous version, push records name
commits that refs keep, `patch delete` keeps the history, and `fsck` reports any commit
a record or patch names that no ref keeps. Checked with git itself after
`git gc --prune=now`, on real sshd nodes."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

MOD = "sglang/srt/mod.py"
OTHER = "sglang/srt/other.py"


def git(store: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "--git-dir", str(store), *args], capture_output=True, text=True, check=check)


def record_metas(store: Path, node: str) -> list[dict]:
    out = git(store, "log", "--format=%B%x00", f"refs/heads/pushes/{node}", "--").stdout
    return [json.loads(line[len("snapver-meta: "):]) for body in out.split("\0")
            for line in body.splitlines() if line.startswith("snapver-meta: ")]


def test_history_survives_rebase_push_and_gc(sshd, ssh_node, make_site_packages, write_config, run_snapver,
                                             tmp_path: Path) -> None:
    old = make_site_packages("ct200", files={MOD: "x = 1\n", OTHER: "y = 1\n"})
    new = make_site_packages("ct129", files={MOD: "x = 1\n", OTHER: "y = 2\n"})  # the next release
    write_config({"ct200": ssh_node("ct200", old), "ct129": ssh_node("ct129", new)}, where=tmp_path)
    store = tmp_path / "snapshots"
    run = lambda *a: run_snapver(*a, cwd=tmp_path)  # noqa: E731
    assert run("pull", "ct200", "ct129").code == 0
    (tmp_path / "p.diff").write_text(f"--- a/{MOD}\n+++ b/{MOD}\n@@ -1 +1 @@\n-x = 1\n+x = 2\n")
    assert run("patch", "import", "p", "p.diff", "--base", "ct200", "-m", "first").code == 0
    v1 = git(store, "rev-parse", "refs/heads/patches/p").stdout.strip()
    folder = Path(run("patch", "new", "p").out.strip().splitlines()[-1])
    (folder / MOD).write_text("x = 3\n")
    assert run("patch", "save", "p", "-m", "second").code == 0
    v2 = git(store, "rev-parse", "refs/heads/patches/p").stdout.strip()
    assert run("push", "p", "ct200", "--yes").code == 0  # the record names v2
    assert record_metas(store, "ct200")[0]["patch_commit"] == v2
    rebased = run("patch", "rebase", "p", "--onto", "ct129")
    assert rebased.code == 0, rebased
    v3 = git(store, "rev-parse", "refs/heads/patches/p").stdout.strip()
    assert run("push", "p", "ct129", "--yes").code == 0
    assert git(store, "rev-parse", f"{v3}^2").stdout.strip() == v2  # the previous version is a parent

    git(store, "gc", "--prune=now", "--quiet")
    for commit in (v1, v2, v3):
        assert git(store, "cat-file", "-t", commit).stdout.strip() == "commit"
    fsck = run("fsck")
    assert fsck.code == 0, fsck
    shown = run("patch", "show", "p", "--history")
    assert shown.code == 0
    lines = [line for line in shown.out.splitlines() if line.startswith("  ") and " base " in line]
    assert [line.split()[0] for line in lines] == [v3[:10], v2[:10], v1[:10]]
    assert [line.split()[4] for line in lines] == ["rebase", "save", "import"]
    assert all(line.split()[1].count("-") == 2 for line in lines)  # each with its date
    assert json.loads(run("patch", "show", "p", "--json").out)["history"][-1]["id"] == v1

    # delete keeps the history that push records name; losing it is what fsck reports
    assert run("patch", "delete", "p").code == 0
    git(store, "gc", "--prune=now", "--quiet")
    assert git(store, "cat-file", "-t", v2).stdout.strip() == "commit"
    assert run("fsck").code == 0
    kept = git(store, "for-each-ref", "--format=%(refname)", "refs/heads/deleted-patches/").stdout.split()
    assert len(kept) == 1 and kept[0].startswith("refs/heads/deleted-patches/p/")
    git(store, "update-ref", "-d", kept[0])
    unkept = run("fsck")
    assert unkept.code == 4
    assert f"names patch_commit {v2[:10]}, which no ref keeps" in unkept.out + unkept.err
    git(store, "reflog", "expire", "--expire=now", "--all")
    git(store, "gc", "--prune=now", "--quiet")
    gone = run("fsck")
    assert gone.code == 4
    assert f"names patch_commit {v3[:10]}, which is not in the store" in gone.out + gone.err
