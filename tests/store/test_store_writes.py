"""The store's write session (Importer): the trees and commits it writes itself must be
exactly what git would write, and its refs move all together or not at all."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from helpers import git_blob, git_ls_tree

from snapver.errors import StoreError
from snapver.model import Entry, Manifest
from snapver.store.records import format_message
from snapver.store.repo import Store

# Names that test quoting and git's tree order: "a.py" sorts before the folder "a" ("." < "/").
PATHS = ["top.py", "pkg/a.py", "pkg/a/b.py", "pkg/a-b", "pkg/a/deep/er/c.py", "pkg/sp ace.py", 'pkg/quo"te.py',
         "pkg/new\nline.py", "pkg/tab\tx", "pkg/caf\u00e9.py", "pkg/bad\udcff.py", "pkg/run.sh", "pkg/link"]


def _git(store: Path, *args: str, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["git", "--git-dir", str(store), *args], input=input, capture_output=True)


def _sha1_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _content(path: str) -> bytes:
    return b"../top.py" if path.endswith("link") else f"content of {path!r}\n".encode("utf-8", "surrogateescape")


def _manifest(paths: list[str]) -> Manifest:
    entries = []
    for path in paths:
        data = _content(path)
        kind, mode = ("l", 0o120777) if path.endswith("link") else ("f", 0o100755 if path.endswith(".sh") else 0o100644)
        entries.append(Entry(path, kind, mode, len(data), "b" * 64, _sha1_blob(data)))
    return Manifest.of(entries)


def _fsck(store: Path) -> None:
    result = _git(store, "fsck", "--full", "--strict")
    assert result.returncode == 0, result.stdout + result.stderr


def _refs(store: Path) -> dict[str, str]:
    out = _git(store, "for-each-ref", "--format=%(refname) %(objectname)").stdout.decode()
    return dict(line.split(" ") for line in out.splitlines())


def _leftovers(store: Path) -> list[str]:
    return sorted(p.name for p in (store / "objects" / "pack").glob("tmp_*"))


def _quote(path: str) -> str:
    """fast-import's C-style quoting, written independently of snapver's: octal for anything unusual."""
    raw = path.encode("utf-8", "surrogateescape")
    return '"' + "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\{b:03o}" for b in raw) + '"'


def _fast_import_stream(commits: list[tuple[str, int | None, Manifest, dict[str, bytes], str, int]]) -> bytes:
    """A stream that makes ``git fast-import`` write the same commits (parents by mark)."""
    out = [b"feature done\n"]
    for mark, (ref, parent_mark, manifest, files, message, stamp) in enumerate(commits, 1):
        tz = time.strftime("%z", time.localtime(stamp))
        text = message.encode()
        out.append(b"commit %s\nmark :%d\ncommitter snapver <snapver@localhost> %d %s\ndata %d\n%s\n"
                   % (ref.encode(), mark, stamp, tz.encode(), len(text), text))
        if parent_mark:
            out.append(b"from :%d\n" % parent_mark)
        out.append(b"deleteall\n")
        for entry in manifest:
            data = _content(entry.path)
            mode = "120000" if entry.kind == "l" else "100755" if entry.mode & 0o111 else "100644"
            out.append(f"M {mode} inline {_quote(entry.path)}\n".encode() + b"data %d\n%s\n" % (len(data), data))
        for path, data in {**files, ".snapver/manifest": manifest.serialize()}.items():
            out.append(f"M 100644 inline {_quote(path)}\n".encode() + b"data %d\n%s\n" % (len(data), data))
        out.append(b"\n")
    out += [b"get-mark :%d\n" % mark for mark in range(1, len(commits) + 1)] + [b"done\n"]
    return b"".join(out)


def test_commits_are_the_ones_git_fast_import_writes(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    first, second = _manifest(PATHS), _manifest([p for p in PATHS if p != "pkg/a/b.py"] + ["pkg/a/new.py"])
    when = datetime(2026, 3, 1, 12, 30, 5, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    stamp = int(when.timestamp())
    messages = [format_message(f"snapshot {i} \u00e9", {"kind": "snapshot", "n": i}) for i in range(3)]
    with store.importer() as importer:
        for path in sorted(set(PATHS) | {"pkg/a/new.py"}):
            importer.add_blob(_content(path))
        marks = [importer.commit("refs/heads/nodes/a", None, first, messages[0], when),
                 importer.commit("refs/heads/nodes/b", None, first, messages[1], when, {"notes/x y": b"extra\n"})]
    ours = [importer.results[mark] for mark in marks]
    with store.importer() as importer:  # a second session: a parent, most trees already in the store
        mark = importer.commit("refs/heads/nodes/a", ours[0], second, messages[2], when)
    ours.append(importer.results[mark])

    reference = tmp_path / "reference"
    subprocess.run(["git", "init", "-q", "--bare", str(reference)], check=True)
    stream = _fast_import_stream([("refs/heads/a", None, first, {}, messages[0], stamp),
                                  ("refs/heads/b", None, first, {"notes/x y": b"extra\n"}, messages[1], stamp),
                                  ("refs/heads/a", 1, second, {}, messages[2], stamp)])
    done = _git(reference, "fast-import", "--quiet", "--done", input=stream)
    assert done.returncode == 0, done.stderr
    assert ours == done.stdout.decode().split()
    _fsck(store.path)
    assert _refs(store.path) == {"refs/heads/nodes/a": ours[2], "refs/heads/nodes/b": ours[1]}
    listing = git_ls_tree(store.path, ours[2])
    assert listing.pop(".snapver/manifest")[1] == _sha1_blob(second.serialize())
    assert listing == {e.path: ("120000" if e.kind == "l" else "100755" if e.mode & 0o111 else "100644", e.oid)
                       for e in second}
    assert all(git_blob(store.path, oid) == _content(path) for path, (_, oid) in listing.items())
    assert _leftovers(store.path) == []


def test_identical_snapshots_of_a_fleet_share_one_tree(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    manifest = _manifest(PATHS[:4])
    now = datetime.now(timezone.utc)
    with store.importer() as importer:
        for path in PATHS[:4]:
            importer.add_blob(_content(path))
        marks = [importer.commit(f"refs/heads/nodes/n{i}", None, manifest, f"node {i}\n", now) for i in range(5)]
    trees = {_git(store.path, "rev-parse", f"{importer.results[m]}^{{tree}}").stdout for m in marks}
    assert len(trees) == 1 and len(set(importer.results.values())) == 5
    _fsck(store.path)
    counted = _git(store.path, "verify-pack", "-v", *map(str, (store.path / "objects" / "pack").glob("*.idx")))
    assert counted.stdout.count(b" tree ") == 4  # root, pkg, pkg/a, .snapver: each once


def test_a_commit_naming_a_blob_the_store_lacks_is_refused(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    manifest = _manifest(["a.py", "b.py"])
    with pytest.raises(StoreError, match="lacks"), store.importer() as importer:  # empty store: no lookup
        importer.add_blob(_content("a.py"))
        importer.commit("refs/heads/nodes/x", None, manifest, "x\n", datetime.now(timezone.utc))
    assert _refs(store.path) == {} and list((store.path / "objects" / "pack").iterdir()) == []
    with store.importer() as importer:
        importer.add_blob(_content("a.py"))
        mark = importer.commit("refs/heads/nodes/x", None, _manifest(["a.py"]), "x\n", datetime.now(timezone.utc))
    before = _refs(store.path)
    for parent, manifest_ in [(importer.results[mark], manifest), ("f" * 40, _manifest(["a.py"]))]:
        with pytest.raises(StoreError, match="lacks"), store.importer() as session:  # looked up in the store
            session.commit("refs/heads/nodes/x", parent, manifest_, "y\n", datetime.now(timezone.utc))
        assert _refs(store.path) == before and _leftovers(store.path) == []
    _fsck(store.path)


def test_a_path_that_is_both_a_file_and_a_folder_is_refused(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    with pytest.raises(StoreError, match="both a file and a folder"), store.importer() as importer:
        for path in ("a", "a/b"):
            importer.add_blob(_content(path))
        importer.commit("refs/heads/nodes/x", None, _manifest(["a", "a/b"]), "x\n", datetime.now(timezone.utc))
    assert _refs(store.path) == {} and list((store.path / "objects" / "pack").iterdir()) == []


def _snapshot(store: Store, ref: str, parent: str | None, name: str) -> str:
    with store.importer() as importer:
        importer.add_blob(_content(name))
        mark = importer.commit(ref, parent, _manifest([name]), f"{name}\n", datetime.now(timezone.utc))
    return importer.results[mark]


def test_refs_move_all_together_or_not_at_all(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    tip = _snapshot(store, "refs/heads/nodes/a", None, "one.py")
    lock = store.path / "refs" / "heads" / "nodes" / "b.lock"  # git holds b: it cannot move
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.write_text("")
    with pytest.raises(StoreError, match="refs"), store.importer() as importer:
        importer.add_blob(_content("two.py"))
        importer.commit("refs/heads/nodes/a", tip, _manifest(["two.py"]), "a\n", datetime.now(timezone.utc))
        importer.commit("refs/heads/nodes/b", None, _manifest(["two.py"]), "b\n", datetime.now(timezone.utc))
    assert _refs(store.path) == {"refs/heads/nodes/a": tip}
    lock.unlink()
    _fsck(store.path)


def test_a_ref_moves_only_forward(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    base = _snapshot(store, "refs/heads/nodes/a", None, "one.py")
    ahead = _snapshot(store, "refs/heads/nodes/a", base, "two.py")
    with pytest.raises(StoreError, match="does not contain"):  # built on base, but a is at ahead
        _snapshot(store, "refs/heads/nodes/a", base, "three.py")
    assert _refs(store.path) == {"refs/heads/nodes/a": ahead}
    # A ref behind the new commit's parent, or absent (a scratch ref), moves as fast-import moved it.
    _git(store.path, "update-ref", "refs/heads/nodes/b", base)
    on_b = _snapshot(store, "refs/heads/nodes/b", ahead, "four.py")
    scratch = _snapshot(store, "refs/snapver/scratch/p", ahead, "five.py")
    assert _refs(store.path) == {"refs/heads/nodes/a": ahead, "refs/heads/nodes/b": on_b,
                                 "refs/snapver/scratch/p": scratch}
    _fsck(store.path)


_KILLED_WRITER = textwrap.dedent("""
    import os, sys
    from datetime import datetime, timezone
    from snapver.model import Entry, Manifest
    from snapver.store.objects import blob_oid
    from snapver.store.repo import Store
    store = Store(__import__("pathlib").Path(sys.argv[1]))
    blobs = [os.urandom(1 << 20) + bytes([i]) for i in range(24)]
    manifest = Manifest.of(Entry(f"big/{i}.bin", "f", 0o100644, len(b), "0" * 64, blob_oid(b))
                           for i, b in enumerate(blobs))
    with store.importer() as importer:
        for data in blobs:
            importer.add_blob(data)
        importer.commit("refs/heads/nodes/k", None, manifest, "k\\n", datetime.now(timezone.utc))
        print("finishing", flush=True)
    print("done", flush=True)
""")


def test_a_writer_killed_while_finishing_leaves_no_ref_to_missing_objects(tmp_path: Path) -> None:
    store = Store.create(tmp_path / "store")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                         os.environ.get("PYTHONPATH", "")])}
    for delay in (0.0, 0.01, 0.03, 0.08, 0.2):
        child = subprocess.Popen([sys.executable, "-c", _KILLED_WRITER, str(store.path)], stdout=subprocess.PIPE,
                                 env=env)
        assert child.stdout is not None and child.stdout.readline() == b"finishing\n"
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait()
        _fsck(store.path)  # every ref names a complete snapshot, every visible pack is whole
        refs = _refs(store.path)
        if refs:
            assert len(git_ls_tree(store.path, refs["refs/heads/nodes/k"])) == 25
        _git(store.path, "update-ref", "-d", "refs/heads/nodes/k")
    with store.importer():
        pass  # a new writer clears the dead ones' temporary packs
    assert _leftovers(store.path) == []


def test_objects_seen_once_are_known_without_git_and_unseen_ones_are_asked(tmp_path: Path, monkeypatch) -> None:
    store = Store.create(tmp_path / "store")
    tip = _snapshot(store, "refs/heads/nodes/a", None, "one.py")
    present, absent = _sha1_blob(_content("one.py")), _sha1_blob(b"not yet\n")
    assert store.existing([present, absent]) == {present}
    assert Store(store.path).ref("refs/heads/nodes/a") == tip
    with store.importer() as importer:
        importer.add_blob(b"not yet\n")
    assert store.existing([present, absent]) == {present, absent}  # a miss is asked again
    monkeypatch.setenv("PATH", "")  # from here on no git process can start
    assert store.existing([present, absent]) == {present, absent}
    with pytest.raises(StoreError):
        store.existing([_sha1_blob(b"never seen\n")])


def test_heads_names_each_refs_commit_as_ref_does(tmp_path: Path) -> None:
    """One for-each-ref for every node's last snapshot gives what rev-parse REF^{commit}
    gives for each: a commit, a tag object peeled to its commit, nothing for a ref that
    names a blob (a hand-edited store) or is not there."""
    store = Store.create(tmp_path / "store")
    tree = _git(store.path, "mktree", input=b"").stdout.decode().strip()
    commit = _git(store.path, "-c", "user.name=t", "-c", "user.email=t@t", "commit-tree", tree, "-m", "x",
                  input=b"").stdout.decode().strip()
    blob = _git(store.path, "hash-object", "-w", "--stdin", input=b"data").stdout.decode().strip()
    assert _git(store.path, "-c", "user.name=t", "-c", "user.email=t@t", "tag", "-a", "-m", "t", "t1",
                commit).returncode == 0
    tag_object = _git(store.path, "rev-parse", "refs/tags/t1").stdout.decode().strip()
    for name, oid in {"a": commit, "blob": blob, "tagged": tag_object}.items():
        (store.path / "refs/heads/nodes").mkdir(parents=True, exist_ok=True)
        (store.path / "refs/heads/nodes" / name).write_text(oid + "\n")  # as a hand edit would
    heads = store.heads("refs/heads/")
    for name in ["a", "blob", "tagged", "missing"]:
        ref = f"refs/heads/nodes/{name}"
        assert heads.get(ref) == store.ref(ref), ref
    assert heads == {"refs/heads/nodes/a": commit, "refs/heads/nodes/tagged": commit}
