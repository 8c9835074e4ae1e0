"""`snapver fsck` finds real damage, names each problem, exits 4 — and reads on.

The store is damaged the way disks and people damage it: a byte flipped inside a pack,
an object file deleted, a manifest rewritten with a wrong blake3 (a commit made with git
plumbing), a ref left pointing at an object that is not there. Commands that read a
damaged object fail with exit 4 instead of printing nothing.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from faultkit import all_refs, git, loosen_objects

SRT = "sglang/srt"
VICTIM = f"{SRT}/layers/l7.py"
VICTIM_CONTENT = b"layer = 7\n" * 8


@pytest.fixture
def pulled(small_site, local_node, write_config, run_snapver, store) -> Path:
    """A store holding one snapshot of ``small_site`` (node ``n1``) and a tag."""
    write_config({"n1": local_node(small_site)})
    result = run_snapver("pull", "n1", "--tag", "good")
    assert result.code == 0, str(result)
    assert (small_site / VICTIM).read_bytes() == VICTIM_CONTENT
    return store


def victim_oid(store: Path) -> str:
    return git(store, "rev-parse", f"refs/heads/nodes/n1:{VICTIM}").decode().strip()


def flip_byte_in_pack(store: Path) -> None:
    """Flip one bit of the victim's content inside its pack (stored there uncompressed)."""
    (pack,) = [p for p in (store / "objects" / "pack").glob("pack-*.pack") if VICTIM_CONTENT in p.read_bytes()]
    data = bytearray(pack.read_bytes())
    at = data.index(VICTIM_CONTENT) + 3
    data[at] ^= 0x01
    pack.chmod(0o644)
    pack.write_bytes(bytes(data))


def delete_object(store: Path, oid: str) -> None:
    """Explode the packs into loose objects (git refuses to unpack objects it has), then delete one."""
    loosen_objects(store)
    loose = store / "objects" / oid[:2] / oid[2:]
    assert loose.exists()
    loose.unlink()


def rewrite_manifest_digest(store: Path, path: str) -> str:
    """Replace the snapshot with one whose manifest has a wrong blake3 for ``path`` (git plumbing)."""
    rev = "refs/heads/nodes/n1"
    manifest = git(store, "cat-file", "blob", f"{rev}:.snapver/manifest").decode()
    lines = manifest.splitlines(keepends=True)
    (index,) = [i for i, line in enumerate(lines) if line.endswith(f"\t{path}\n")]
    kind, mode, size, digest, oid = lines[index].split("\t")[0].split(" ")
    wrong = "0" * 64 if digest != "0" * 64 else "1" * 64
    lines[index] = f"{kind} {mode} {size} {wrong} {oid}\t{path}\n"
    blob = git(store, "hash-object", "-w", "--stdin", input="".join(lines).encode()).decode().strip()
    snapver_tree = git(store, "mktree", input=f"100644 blob {blob}\tmanifest\n".encode()).decode().strip()
    top = [line for line in git(store, "ls-tree", rev).decode().splitlines() if not line.endswith("\t.snapver")]
    top.append(f"040000 tree {snapver_tree}\t.snapver")
    tree = git(store, "mktree", input=("\n".join(top) + "\n").encode()).decode().strip()
    message = git(store, "log", "-1", "--format=%B", rev)
    env = {"GIT_AUTHOR_NAME": "x", "GIT_AUTHOR_EMAIL": "x@x", "GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@x"}
    old_env = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        commit = git(store, "commit-tree", tree, input=message).decode().strip()
    finally:
        for key, value in old_env.items():
            os.environ.pop(key) if value is None else os.environ.__setitem__(key, value)
    git(store, "update-ref", rev, commit)
    return commit


def chmod_in_tree(store: Path, path: str) -> str:
    """Replace the snapshot with one whose tree gives ``path`` mode 100755 while its manifest
    still says 100644 (git plumbing, through an index of its own; message and parents kept)."""
    rev = "refs/heads/nodes/n1"
    index = store.parent / "chmod.index"
    # update-index wants a work tree, though --cacheinfo never reads one.
    env = {**os.environ, "GIT_INDEX_FILE": str(index), "GIT_WORK_TREE": str(store.parent), "GIT_AUTHOR_NAME": "x",
           "GIT_AUTHOR_EMAIL": "x@x", "GIT_COMMITTER_NAME": "x", "GIT_COMMITTER_EMAIL": "x@x"}

    def plumbing(*args: str, input: bytes | None = None) -> str:  # noqa: A002
        return subprocess.run(["git", "--git-dir", str(store), *args], input=input, env=env, capture_output=True,
                              check=True).stdout.decode().strip()

    (line,) = plumbing("ls-tree", rev, "--", path).splitlines()
    assert line.startswith("100644 "), line
    oid = line.split()[2]
    plumbing("read-tree", rev)
    plumbing("update-index", "--cacheinfo", f"100755,{oid},{path}")
    tree = plumbing("write-tree")
    parents = [arg for parent in plumbing("log", "-1", "--format=%P", rev).split() for arg in ("-p", parent)]
    commit = plumbing("commit-tree", tree, *parents, input=git(store, "log", "-1", "--format=%B", rev))
    plumbing("update-ref", rev, commit)
    index.unlink()
    return commit


def dangle_ref(store: Path, name: str) -> str:
    """A ref file naming an object the store does not have (what a lost write leaves)."""
    missing = "0123456789abcdef0123456789abcdef01234567"
    ref = store / name
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(missing + "\n")
    return missing


def fsck_problems(run_snapver) -> list[str]:
    result = run_snapver("fsck")
    assert result.code == 4, str(result)
    assert "Traceback" not in result.err and "internal error" not in result.err
    assert "snapver: error:" in result.err
    return [line for line in result.err.splitlines() if line.startswith("problem: ")]


def test_clean_store_is_ok(pulled, run_snapver) -> None:
    result = run_snapver("fsck")
    assert result.code == 0, str(result)
    assert re.search(r"store ok: 1 snapshot \(as log lists them\), 14 blobs verified", result.out), result.out


def test_flipped_byte_in_a_blob_is_found_and_named(pulled, run_snapver) -> None:
    oid = victim_oid(pulled)
    flip_byte_in_pack(pulled)
    problems = fsck_problems(run_snapver)
    ours = [p for p in problems if not p.startswith("problem: git fsck:")]
    assert any(VICTIM in p and oid in p and "corrupt" in p for p in ours), problems


def test_missing_object_is_found_and_named(pulled, run_snapver) -> None:
    oid = victim_oid(pulled)
    delete_object(pulled, oid)
    problems = fsck_problems(run_snapver)
    assert any(VICTIM in p and oid in p and "missing" in p for p in problems), problems


def test_manifest_blake3_mismatch_is_found_and_named(pulled, run_snapver) -> None:
    commit = rewrite_manifest_digest(pulled, VICTIM)
    problems = fsck_problems(run_snapver)
    # git sees nothing wrong: only snapver's own manifest check can find this.
    assert not any("git fsck" in p for p in problems), problems
    assert any(commit[:10] in p and VICTIM in p and "blake3" in p for p in problems), problems


def test_a_tree_mode_that_disagrees_with_the_manifest_is_found_and_named(pulled, run_snapver) -> None:
    """The tree says executable, the manifest does not: a push or rollback of this snapshot
    would write the file with the wrong mode. git sees nothing wrong; snapver fsck must."""
    commit = chmod_in_tree(pulled, VICTIM)
    problems = fsck_problems(run_snapver)
    assert not any("git fsck" in p for p in problems), problems
    assert any(commit[:10] in p and VICTIM in p and "100755" in p and "100644" in p for p in problems), problems


def test_object_rewritten_with_other_content_is_found_by_its_hash(pulled, run_snapver) -> None:
    """Damage zlib cannot see: a loose object replaced by a well-formed one of other content
    (git reads it back without a complaint; only hashing what was read finds it)."""
    import zlib

    oid = victim_oid(pulled)
    delete_object(pulled, oid)
    forged = VICTIM_CONTENT.replace(b"7", b"8")
    loose = pulled / "objects" / oid[:2] / oid[2:]
    loose.write_bytes(zlib.compress(b"blob %d\0" % len(forged) + forged))
    assert git(pulled, "cat-file", "blob", oid) == forged
    problems = [p for p in fsck_problems(run_snapver) if not p.startswith("problem: git fsck:")]
    assert any(VICTIM in p and oid in p and "does not hash to its id" in p for p in problems), problems


@pytest.mark.parametrize("ref", ["refs/heads/nodes/ghost", "refs/tags/lost"])
def test_dangling_ref_is_found_and_named(pulled, run_snapver, ref: str) -> None:
    missing = dangle_ref(pulled, ref)
    problems = fsck_problems(run_snapver)
    ours = [p for p in problems if not p.startswith("problem: git fsck:")]
    assert any(ref in p and missing[:10] in p and "dangling" in p for p in ours), problems
    listed = run_snapver("log")  # git's own failure, as every error: one line and a hint
    lines = listed.err.strip().splitlines()
    assert listed.code == 4 and len(lines) == 2 and lines[1].startswith("hint: ") and "fsck" in lines[1], str(listed)


def test_every_problem_is_reported_in_one_run(pulled, run_snapver, small_site) -> None:
    """One damaged object never stops the check: four kinds of damage, four reports."""
    (small_site / SRT / "server_args.py").write_text("port = 30001\n")
    assert run_snapver("pull", "n1").code == 0  # a second snapshot, so the tag keeps the first
    commit = rewrite_manifest_digest(pulled, f"{SRT}/server_args.py")
    oid = victim_oid(pulled)
    flip_byte_in_pack(pulled)
    missing = dangle_ref(pulled, "refs/heads/nodes/ghost")
    problems = [p for p in fsck_problems(run_snapver) if not p.startswith("problem: git fsck:")]
    assert any(VICTIM in p and oid in p and "corrupt" in p for p in problems), problems
    assert any(commit[:10] in p and "server_args.py" in p and "blake3" in p for p in problems), problems
    assert any("refs/heads/nodes/ghost" in p and missing[:10] in p for p in problems), problems


def test_reading_a_corrupt_object_fails_with_exit_4(pulled, run_snapver) -> None:
    """`show` of a damaged file used to print nothing and exit 0."""
    flip_byte_in_pack(pulled)
    result = run_snapver("show", "n1", VICTIM)
    assert result.code == 4, str(result)
    assert result.out == "" and "Traceback" not in result.err
    assert "corrupt" in result.err and "fsck" in result.err
    undamaged = run_snapver("show", "n1", f"{SRT}/server_args.py")
    assert undamaged.code == 0 and undamaged.out == "port = 30000\n", str(undamaged)


@pytest.mark.parametrize("kind", ["blob", "tree"])
def test_a_tag_naming_a_blob_or_a_tree_is_a_store_error(pulled, run_snapver, kind: str) -> None:
    """A tag ref pointing at something that is not a commit (damage, or a hand-made ref):
    exit 4 naming it, never an internal error (tag --list: KeyError, show: IndexError)."""
    target = git(pulled, "rev-parse", f"refs/heads/nodes/n1:{VICTIM}" if kind == "blob" else
                 f"refs/heads/nodes/n1:{SRT}").decode().strip()
    git(pulled, "update-ref", "refs/tags/odd", target)
    for args in (("tag", "--list"), ("show", "odd"), ("diff", "-q", "odd", "n1")):
        result = run_snapver(*args)
        assert result.code == 4, (args, str(result))
        assert "internal error" not in result.err and "not a commit" in result.err and "fsck" in result.err, args


def test_fsck_changes_nothing(pulled, run_snapver) -> None:
    before = all_refs(pulled)
    flip_byte_in_pack(pulled)
    fsck_problems(run_snapver)
    assert all_refs(pulled) == before
