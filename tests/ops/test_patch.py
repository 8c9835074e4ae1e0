"""Patches: import (diff -u, git diff, format-patch), export, new/save, capture, rebase.

Results are read back from the store with the git command line and compared with
what the test computed itself (hashlib, blake3, `patch -p1`, `git apply`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path

import blake3
import pytest
from helpers import git_blob, git_ls_tree, tree_hashes

from snapver.config import Config, load_config
from snapver.errors import PatchError, RefError, UsageError
from snapver.ops.patch import capture_patch, delete_patch, export_patch, import_patch, load_patch, new_patch
from snapver.ops.pull import pull
from snapver.store.repo import Store

RUNNER = "sglang/srt/model_executor/runner/base_cuda_graph_runner.py"
UTILS = "sglang/srt/speculative/dflash_utils.py"
GONE = "sglang/srt/speculative/dflash_disaggregation.py"
ADDED = "sglang/srt/speculative/dflash_hotfix.py"
PATCH_REF = "refs/heads/patches/"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}


def sh(*args: str, cwd: Path | None = None, input: bytes | None = None) -> bytes:  # noqa: A002
    env = {**os.environ, **GIT_ENV}
    done = subprocess.run(list(args), cwd=cwd, input=input, capture_output=True, env=env)
    assert done.returncode == 0, f"{args}: {done.stderr.decode(errors='replace')}"
    return done.stdout


def store_files(store: Path, rev: str) -> dict[str, tuple[str, bytes]]:
    """path → (git mode, content) of a commit's tree, manifest left out."""
    listing = git_ls_tree(store, rev)
    listing.pop(".snapver/manifest", None)
    listing.pop(".snapver/record", None)
    listing.pop(".snapver/env", None)
    return {path: (mode, git_blob(store, oid)) for path, (mode, oid) in listing.items()}


def meta(store: Path, rev: str) -> dict:
    body = sh("git", "--git-dir", str(store), "log", "-1", "--format=%B", rev).decode()
    line = [x for x in body.splitlines() if x.startswith("snapver-meta: ")][0]
    return json.loads(line[len("snapver-meta: "):])


def copy_files(source: Path, dest: Path, paths: list[str]) -> None:
    for rel in paths:
        if (source / rel).exists():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source / rel, dest / rel)


def git_diff_of_edits(template: Path, scratch: Path) -> tuple[bytes, dict[str, tuple[int, bytes] | None]]:
    """A user's `git diff` of a CUDA-graph fix: edit, mode change, new and deleted file."""
    repo = scratch / "repo"
    repo.mkdir(parents=True)
    copy_files(template, repo, [RUNNER, UTILS, GONE])
    sh("git", "init", "-q", cwd=repo)
    sh("git", "add", "-A", cwd=repo)
    sh("git", "commit", "-qm", "base", cwd=repo)
    runner = (repo / RUNNER).read_bytes()
    lines = runner.split(b"\n")
    lines.insert(10, b"# snapver test: CUDA graph capture fix")
    lines[30] = lines[30] + b"  # patched"
    (repo / RUNNER).write_bytes(b"\n".join(lines))
    with open(repo / UTILS, "ab") as handle:
        handle.write(b"\n\ndef hotfix_enabled():\n    return True\n")
    os.chmod(repo / UTILS, 0o755)
    (repo / GONE).unlink()
    (repo / ADDED).write_bytes(b'"""Added by a hot-fix."""\nVALUE = 42\n')
    sh("git", "add", "-A", cwd=repo)
    diff = sh("git", "diff", "--cached", cwd=repo)
    expected: dict[str, tuple[int, bytes] | None] = {GONE: None}
    for rel in (RUNNER, UTILS, ADDED):
        expected[rel] = (stat.S_IMODE(os.stat(repo / rel).st_mode), (repo / rel).read_bytes())
    return diff, expected


def snapshot(config_path: Path, node: str, tag: str | None = None) -> tuple[Config, Store]:
    """Pull ``node`` in this process (set-up, not what these tests are about)."""
    config = load_config(str(config_path))
    store = Store.open_or_create(config.store_path)
    assert pull(store, config.select([node]), tag=tag).exit_code == 0
    return config, store


@pytest.fixture
def real_base(sglang_site_template, write_config, local_node, run_snapver, isolated_env):
    """A store holding one snapshot of the real sglang tree (read in place: pull never writes)."""
    write_config({"ct200": local_node(sglang_site_template)})
    result = run_snapver("pull", "ct200")
    assert result.code == 0, result
    return isolated_env / "snapshots"


def test_git_diff_import_export_roundtrip_on_real_tree(real_base, sglang_site_template, run_snapver, tmp_path):
    template = sglang_site_template
    diff, expected = git_diff_of_edits(template, tmp_path / "edit")
    Path("fix.diff").write_bytes(diff)
    result = run_snapver("patch", "import", "cuda-fix", "fix.diff", "--base", "ct200", "--nodes", "ct200",
                         "-m", "CUDA graph fix")
    assert result.code == 0, result
    store = real_base
    base_head = sh("git", "--git-dir", str(store), "rev-parse", "refs/heads/nodes/ct200").decode().strip()

    # The patch commit: base tree + exactly the change, parent = base, metadata names the base.
    patched = git_ls_tree(store, PATCH_REF + "cuda-fix")
    base = git_ls_tree(store, base_head)
    for listing in (patched, base):
        listing.pop(".snapver/manifest")
        listing.pop(".snapver/record", None)  # a snapshot's RECORD rows; a patch commit has none
        listing.pop(".snapver/env", None)  # a snapshot's environment
    assert sh("git", "--git-dir", str(store), "rev-parse", PATCH_REF + "cuda-fix^").decode().strip() == base_head
    changed = {p for p in set(patched) | set(base) if patched.get(p) != base.get(p)}
    assert changed == {RUNNER, UTILS, GONE, ADDED}
    assert GONE not in patched
    for rel in (RUNNER, UTILS, ADDED):
        mode, content = expected[rel]  # type: ignore[misc]
        assert git_blob(store, patched[rel][1]) == content
        assert patched[rel][0] == ("100755" if mode & 0o111 else "100644")
    info = meta(store, PATCH_REF + "cuda-fix")
    assert (info["kind"], info["base"], info["nodes"], info["message"]) == ("patch", base_head, ["ct200"],
                                                                            "CUDA graph fix")
    manifest = git_blob(store, git_ls_tree(store, PATCH_REF + "cuda-fix")[".snapver/manifest"][1]).decode()
    row = [line for line in manifest.splitlines() if line.endswith("\t" + RUNNER)][0]
    assert row.split()[3] == blake3.blake3(expected[RUNNER][1]).hexdigest()  # type: ignore[index]
    assert run_snapver("fsck").code == 0

    # Export applies with patch -p1 and git apply inside site-packages, giving the same files.
    exported = run_snapver("patch", "export", "cuda-fix")
    assert exported.code == 0, exported
    out = exported.out.encode("utf-8", "surrogateescape")
    for tool in (["patch", "-p1", "--batch", "--quiet"], ["git", "apply"]):
        site = tmp_path / tool[0]
        copy_files(template, site, [RUNNER, UTILS, GONE])
        sh(*tool, cwd=site, input=out)
        for rel, want in expected.items():
            if want is None:
                assert not (site / rel).exists()
            else:
                assert (site / rel).read_bytes() == want[1], (tool, rel)
                assert stat.S_IMODE(os.stat(site / rel).st_mode) & 0o111 == want[0] & 0o111

    listing = run_snapver("patch", "list", "--json")
    assert [(p["name"], p["files"]) for p in json.loads(listing.out)["patches"]] == [("cuda-fix", 4)]
    shown = run_snapver("patch", "show", "cuda-fix", "--json")
    document = json.loads(shown.out)
    assert {f["path"]: f["status"] for f in document["files"]} == {RUNNER: "M", UTILS: "M", GONE: "D", ADDED: "A"}


@pytest.fixture
def small(make_site_packages, write_config, local_node, run_snapver, isolated_env):
    """A small local node, snapshotted; returns (site-packages, store, config, Store)."""
    files = {
        "sglang/srt/a.py": "one\ntwo\nthree\nfour\nfive\nsix\nseven\neight\nnine\nten\n",
        "sglang/srt/crlf.py": b"x = 1\r\ny = 2\r\nz = 3",
        "sglang/srt/dir name/with space.py": "s = 1\n",
        "sglang/srt/gone.py": "bye\n",
        "sglang/srt/blob.bin": b"\x00\x01binary\x00",
        "sglang/srt/日本.py": "jp = 1\n",
        "sglang/top.py": "outside the tracked tree\n",
    }
    site = make_site_packages("small", files=files)
    os.symlink("a.py", site / "sglang/srt/link.py")
    os.symlink("/etc", site / "sglang/srt/etc")
    config_path = write_config({"small": local_node(site)})
    assert run_snapver("pull", "small").code == 0
    store = isolated_env / "snapshots"
    return site, store, load_config(str(config_path)), Store(store)


def _import(small, name: str, diff: bytes, **kwargs):
    _, _, config, store = small
    return import_patch(store, config, name, diff, f"{name}.diff", "small", **kwargs)


def test_import_formats(small, tmp_path):
    site, store_path, _, _ = small
    old = tmp_path / "old"
    new = tmp_path / "new"
    shutil.copytree(site, old, symlinks=True)
    shutil.copytree(site, new, symlinks=True)
    (new / "sglang/srt/a.py").write_text("one\ntwo\nTHREE\nfour\nfive\nsix\nseven\neight\nnine\nTEN\n")

    # diff -u of one file, run inside site-packages: no prefixes, timestamps after a tab.
    plain = subprocess.run(["diff", "-u", "sglang/srt/a.py", str(new / "sglang/srt/a.py")], cwd=old,
                           capture_output=True).stdout
    plain = plain.replace(str(new).encode() + b"/", b"")
    patch = _import(small, "plain", plain)
    assert [(f.path, f.status) for f in patch.files] == [("sglang/srt/a.py", "M")]
    assert git_blob(store_path, git_ls_tree(store_path, PATCH_REF + "plain")["sglang/srt/a.py"][1]) == \
        (new / "sglang/srt/a.py").read_bytes()

    # diff -ruN between two trees: one extra leading folder, new/deleted files shown at the epoch.
    (new / "sglang/srt/crlf.py").write_bytes(b"x = 1\r\ny = 20\r\nz = 3")  # CRLF kept, still no final newline
    (new / "sglang/srt/gone.py").unlink()
    (new / "sglang/srt/dir name/new file.py").write_text("fresh\n")
    recursive = subprocess.run(["diff", "-ruN", "--no-dereference", "old", "new"], cwd=tmp_path,
                               capture_output=True).stdout
    patch = _import(small, "recursive", recursive)
    got = store_files(store_path, PATCH_REF + "recursive")
    assert {f.path: f.status for f in patch.files} == {
        "sglang/srt/a.py": "M", "sglang/srt/crlf.py": "M", "sglang/srt/gone.py": "D",
        "sglang/srt/dir name/new file.py": "A"}
    for rel in ("sglang/srt/a.py", "sglang/srt/crlf.py", "sglang/srt/dir name/new file.py"):
        assert got[rel][1] == (new / rel).read_bytes(), rel
    assert "sglang/srt/gone.py" not in got

    # git format-patch (mail headers, a/ b/ prefixes, binary literal, mode change); subject → message.
    repo = tmp_path / "repo"
    shutil.copytree(old, repo, symlinks=True)
    sh("git", "init", "-q", cwd=repo)
    sh("git", "add", "-A", cwd=repo)
    sh("git", "commit", "-qm", "base", cwd=repo)
    (repo / "sglang/srt/blob.bin").write_bytes(b"\x00\x02other binary\x00" * 3)
    (repo / "sglang/srt/dir name/with space.py").write_text("s = 2\n")
    (repo / "sglang/srt/日本.py").write_text("jp = 2\n")  # git quotes this name: "a/sglang/srt/\346..."
    os.chmod(repo / "sglang/srt/a.py", 0o755)
    sh("git", "commit", "-qam", "Fix the graph capture", cwd=repo)
    mail = sh("git", "format-patch", "-1", "--binary", "--stdout", cwd=repo)
    patch = _import(small, "mail", mail)
    assert patch.message == "Fix the graph capture"
    got = store_files(store_path, PATCH_REF + "mail")
    assert got["sglang/srt/blob.bin"][1] == b"\x00\x02other binary\x00" * 3
    assert got["sglang/srt/dir name/with space.py"][1] == b"s = 2\n"
    assert got["sglang/srt/a.py"] == ("100755", (old / "sglang/srt/a.py").read_bytes())
    assert {f.path for f in patch.files} == {"sglang/srt/blob.bin", "sglang/srt/dir name/with space.py",
                                             "sglang/srt/a.py", "sglang/srt/日本.py"}
    assert got["sglang/srt/日本.py"][1] == b"jp = 2\n"
    # Exported again, it applies with git apply (binary too) and patch -p1 (text) in site-packages.
    full = export_patch(small[3], "mail")
    text_only = b"".join(b"diff --git " + part for part in full.split(b"diff --git ")[1:]
                         if b"GIT binary patch" not in part)  # patch(1) has no binary patches
    text_files = ("sglang/srt/a.py", "sglang/srt/dir name/with space.py", "sglang/srt/日本.py")
    for tool, diff, files in ((["git", "apply"], full, text_files + ("sglang/srt/blob.bin",)),
                              (["patch", "-p1", "--batch", "--quiet"], text_only, text_files)):
        target = tmp_path / f"apply-{tool[0]}"
        shutil.copytree(old, target, symlinks=True)
        sh(*tool, cwd=target, input=diff)
        for rel in files:
            assert (target / rel).read_bytes() == (repo / rel).read_bytes(), (tool, rel)
        assert os.stat(target / "sglang/srt/a.py").st_mode & 0o111

    # A rename (git diff -M): a pure one, and one with an edit.
    pure = _import(small, "moved", b"diff --git a/sglang/srt/gone.py b/sglang/srt/moved.py\nsimilarity index 100%\n"
                   b"rename from sglang/srt/gone.py\nrename to sglang/srt/moved.py\n")
    assert {f.path: f.status for f in pure.files} == {"sglang/srt/gone.py": "D", "sglang/srt/moved.py": "A"}
    assert store_files(store_path, PATCH_REF + "moved")["sglang/srt/moved.py"][1] == b"bye\n"
    _import(small, "edited", b"diff --git a/sglang/srt/gone.py b/sglang/srt/kept.py\nsimilarity index 50%\n"
            b"rename from sglang/srt/gone.py\nrename to sglang/srt/kept.py\n--- a/sglang/srt/gone.py\n"
            b"+++ b/sglang/srt/kept.py\n@@ -1 +1 @@\n-bye\n+hello\n")
    edited = store_files(store_path, PATCH_REF + "edited")
    assert edited["sglang/srt/kept.py"][1] == b"hello\n" and "sglang/srt/gone.py" not in edited


def test_import_refuses_bad_diffs(small, tmp_path):
    site, store_path, _, _ = small
    good = (b"--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -2,3 +2,3 @@\n two\n-three\n+THREE\n four\n")
    cases = {
        "truncated hunk": (good[:-6], "ends early"),
        "garbage in hunk": (good.replace(b" four\n", b"?four\n"), "unexpected line"),
        "no diff": (b"just some text\n", "holds no unified diff"),
        "wrong base content": (good.replace(b"-three", b"-tree"), "hunk 1 (@@ -2,3 +2,3 @@) does not apply: "
                               "line 3: expected 'tree', found 'three'"),
        "CRLF diff": (good.replace(b"\n", b"\r\n"), "hunk 1 (@@ -2,3 +2,3 @@) does not apply: line 2: "
                      "the line endings differ (CRLF in the diff, LF in the file)"),
        "no final newline": (good.replace(b" four\n", b" four\n\\ No newline at end of file\n"),
                             "line 4: the line endings differ (none in the diff, LF in the file)"),
        "wrong position": (good.replace(b"@@ -2,3 +2,3 @@", b"@@ -5,3 +5,3 @@"), "are at line 2 instead"),
        "wrong index blob": (b"diff --git a/sglang/srt/a.py b/sglang/srt/a.py\nindex 1234567..89abcde 100644\n"
                             + good, "made against blob 1234567"),
        "dot-dot path": (good.replace(b"b/sglang/srt/a.py", b"b/../../etc/passwd"), "unsafe path"),
        "absolute path": (good.replace(b"+++ b/sglang/srt/a.py", b"+++ /etc/passwd"), "unsafe path"),
        "through a symlink": (b"--- /dev/null\n+++ b/sglang/srt/etc/cron.d/evil\n@@ -0,0 +1 @@\n+x\n",
                              "passes through the symlink sglang/srt/etc"),
        "symlink as file": (b"--- a/sglang/srt/link.py\n+++ b/sglang/srt/link.py\n@@ -1 +1 @@\n-a.py\n+b.py\n",
                            "sglang/srt/link.py is a symlink in the base"),
        "file as symlink": (b"diff --git a/sglang/srt/a.py b/sglang/srt/a.py\nindex 1234567..89abcde 120000\n"
                            + good, "sglang/srt/a.py is a file in the base; the diff treats it as a symlink"),
        "outside tracked": (b"--- a/sglang/top.py\n+++ b/sglang/top.py\n@@ -1 +1 @@\n-outside the tracked tree\n"
                            b"+x\n", "not in the base"),
        "creates existing": (b"--- /dev/null\n+++ b/sglang/srt/a.py\n@@ -0,0 +1 @@\n+x\n",
                             "already exists in the base"),
        "delete partly": (b"--- a/sglang/srt/gone.py\n+++ /dev/null\n@@ -1 +0,0 @@\n-bye\n", None),
        "binary missing": (b"diff --git a/sglang/srt/blob.bin b/sglang/srt/blob.bin\nindex 1..2 100644\n"
                           b"Binary files a/sglang/srt/blob.bin and b/sglang/srt/blob.bin differ\n",
                           "binary content is not in the diff"),
        "only in": (b"Only in new/sglang/srt: x.py\n", "lacks that file's content"),
    }
    for number, (label, (diff, message)) in enumerate(cases.items()):
        if message is None:
            # The one well-formed case: a full deletion imports fine.
            assert _import(small, f"ok{number}", diff).files[0].status == "D"
            continue
        with pytest.raises(PatchError) as caught:
            _import(small, f"bad-{number}", diff)
        assert message in str(caught.value), (label, str(caught.value))
    # Nothing was recorded by any refusal.
    refs = sh("git", "--git-dir", str(store_path), "for-each-ref", "--format=%(refname)", PATCH_REF).decode().split()
    assert refs == [PATCH_REF + f"ok{list(cases).index('delete partly')}"]
    # An explicit strip level that does not fit is refused too.
    with pytest.raises(PatchError, match="does not fit base"):
        _import(small, "strip", good, strip=0)


def test_export_of_a_symlink_retarget_imports_back(small, run_snapver, tmp_path):
    """git writes a symlink's mode only on its index line (`index a..b 120000`): the export
    of a retargeted link imports back as the same patch, and a regular file's unchanged
    mode there (git's 100644) leaves the base's exact bits (0o664 here) alone."""
    site, store_path, _, store = small
    os.chmod(site / "sglang/srt/a.py", 0o664)
    assert run_snapver("pull", "small").code == 0
    made = run_snapver("patch", "new", "relink", "--base", "small")
    assert made.code == 0, made
    folder = Path(made.out.strip().splitlines()[-1])
    (folder / "sglang/srt/link.py").unlink()
    os.symlink("crlf.py", folder / "sglang/srt/link.py")
    (folder / "sglang/srt/a.py").write_text("edited\n")
    assert run_snapver("patch", "save", "relink").code == 0
    exported = export_patch(store, "relink")
    assert b"index " in exported and b" 120000\n" in exported and b"old mode" not in exported
    (tmp_path / "relink.diff").write_bytes(exported)

    imported = run_snapver("patch", "import", "relink2", str(tmp_path / "relink.diff"), "--base", "small")
    assert imported.code == 0, imported
    assert store_files(store_path, PATCH_REF + "relink2") == store_files(store_path, PATCH_REF + "relink")
    original, again = load_patch(store, "relink"), load_patch(store, "relink2")
    assert again.base == original.base
    assert [(f.path, f.status, f.patch) for f in again.files] == [(f.path, f.status, f.patch) for f in original.files]
    assert [f.path for f in again.files] == ["sglang/srt/a.py", "sglang/srt/link.py"]
    assert stat.S_IMODE(again.files[0].patch.mode) == 0o664  # type: ignore[union-attr]
    # git apply of the export in a copy of site-packages retargets the link too.
    target = tmp_path / "apply"
    shutil.copytree(site, target, symlinks=True)
    sh("git", "apply", cwd=target, input=exported)
    assert os.readlink(target / "sglang/srt/link.py") == "crlf.py"
    assert (target / "sglang/srt/a.py").read_text() == "edited\n"


def test_cli_errors_are_one_line(small, run_snapver):
    site, store_path, _, _ = small
    Path("bad.diff").write_bytes(b"--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -2,3 +2,3 @@\n two\n-x\n")
    for args, code, text in [
        (("patch", "import", "p1", "bad.diff", "--base", "small"), 2, "ends early"),
        (("patch", "import", "p1", "missing.diff", "--base", "small"), 2, "cannot read missing.diff"),
        (("patch", "show", "nope"), 2, "unknown patch 'nope'"),
        (("push", "nope", "small", "--yes"), 2, "unknown patch 'nope'"),
        (("patch", "import", "small", "bad.diff", "--base", "small"), 2, "named like the node"),
    ]:
        result = run_snapver(*args)
        assert result.code == code, result
        lines = result.err.splitlines()
        assert lines[0].startswith("snapver: error: ") and text in lines[0], result
        assert "Traceback" not in result.err and len(lines) <= 2, result


def test_new_and_save_record_the_checkout(small, run_snapver, isolated_env):
    site, store_path, _, _ = small
    result = run_snapver("patch", "new", "edit", "--base", "small", "--nodes", "small")
    assert result.code == 0, result
    # stdout is the folder alone (`cd "$(snapver patch new …)"`); what to do next goes to stderr.
    assert result.out == f"{isolated_env / '.snapver-patches' / 'edit'}\n", result
    assert "files checked out" in result.err and "snapver patch save edit" in result.err, result
    folder = Path(result.out.strip())
    # The checkout is the base tree exactly (links as links, modes).
    assert tree_hashes(folder) == tree_hashes(site)
    assert os.readlink(folder / "sglang/srt/link.py") == "a.py"

    (folder / "sglang/srt/a.py").write_text("edited\n")
    os.chmod(folder / "sglang/srt/crlf.py", 0o750)
    (folder / "sglang/srt/gone.py").unlink()
    (folder / "sglang/srt/sub").mkdir()
    (folder / "sglang/srt/sub/new.py").write_text("new = True\n")
    (folder / "sglang/srt/__pycache__").mkdir()
    (folder / "sglang/srt/__pycache__/a.cpython-311.pyc").write_bytes(b"junk")  # excluded, never recorded
    result = run_snapver("patch", "save", "edit", "-m", "first edit")
    assert result.code == 0, result
    got = store_files(store_path, PATCH_REF + "edit")
    assert got["sglang/srt/a.py"] == ("100644", b"edited\n")
    assert got["sglang/srt/sub/new.py"] == ("100644", b"new = True\n")
    assert "sglang/srt/gone.py" not in got and not any("__pycache__" in p for p in got)
    manifest = git_blob(store_path, git_ls_tree(store_path, PATCH_REF + "edit")[".snapver/manifest"][1]).decode()
    assert any(line.startswith("f 100750 ") and line.endswith("\tsglang/srt/crlf.py") for line in manifest.splitlines())
    # Saved on top of the empty first commit: the patch has a history, its parent chain ends at the base.
    first = sh("git", "--git-dir", str(store_path), "rev-parse", PATCH_REF + "edit^").decode().strip()
    assert meta(store_path, first)["source"] == "new"
    assert meta(store_path, PATCH_REF + "edit")["message"] == "first edit"

    again = run_snapver("patch", "save", "edit")
    assert again.code == 0 and "nothing to save" in again.out
    # `show PATCH` says what the patch is and what it changes from its base (it said
    # `node: ? ()`, no files changed, and diffed against the patch's previous version).
    lines = run_snapver("show", "edit").out.splitlines()
    assert lines[0].startswith("patch edit (commit ") and lines[1].startswith("base:          small ")
    assert "files:         " in "\n".join(lines) and ", 4 changed by the patch" in "\n".join(lines), lines
    assert not any(line.startswith("node:") for line in lines)
    shown = json.loads(run_snapver("patch", "show", "edit", "--json").out)
    assert len(shown["history"]) == 2 and shown["checkout"] == str(folder)
    assert {f["path"] for f in shown["files"]} == {"sglang/srt/a.py", "sglang/srt/crlf.py", "sglang/srt/gone.py",
                                                   "sglang/srt/sub/new.py"}
    # A second `patch new` of the same name refuses (the folder holds work).
    refused = run_snapver("patch", "new", "edit", "--base", "small")
    assert refused.code == 2 and "already exists" in refused.err
    # Without --base, `patch new` checks an existing patch out again (its saved tree).
    _, _, config, store = small
    shutil.rmtree(folder)
    again = new_patch(store, config, "edit", None)
    assert again.folder == folder and (folder / "sglang/srt/a.py").read_text() == "edited\n"
    assert not (folder / "sglang/srt/gone.py").exists() and (folder / "sglang/srt/sub/new.py").exists()
    assert stat.S_IMODE(os.stat(folder / "sglang/srt/crlf.py").st_mode) == 0o750
    delete_patch(store, "edit")
    assert sh("git", "--git-dir", str(store_path), "for-each-ref", PATCH_REF) == b""


def test_capture_turns_live_drift_into_a_patch(make_site_packages, write_config, ssh_node, run_snapver,
                                               isolated_env):
    site = make_site_packages("ct200", files={"sglang/srt/a.py": "a = 1\n", "sglang/srt/b.py": "b = 1\n",
                                              "sglang/srt/c.py": "c = 1\n"})
    config_path = write_config({"ct200": ssh_node("ct200", site)})
    config, snapver_store = snapshot(config_path, "ct200", "clean")
    assert capture_patch(snapver_store, config, "none", "ct200", "clean") is None
    # Hand-made hot-fixes on the node.
    (site / "sglang/srt/a.py").write_text("a = 2  # hot-fix\n")
    (site / "sglang/srt/b.py").unlink()
    os.chmod(site / "sglang/srt/c.py", 0o700)
    (site / "sglang/srt/extra.py").write_text("extra = 1\n")
    result = run_snapver("patch", "capture", "hotfix", "ct200", "--base", "clean")
    assert result.code == 0, result
    store = isolated_env / "snapshots"
    got = store_files(store, PATCH_REF + "hotfix")
    assert got["sglang/srt/a.py"][1] == b"a = 2  # hot-fix\n"
    assert got["sglang/srt/extra.py"][1] == b"extra = 1\n"
    assert "sglang/srt/b.py" not in got
    assert "hotfix" in result.out and "captured from ct200" in result.out
    shown = load_patch(snapver_store, "hotfix")
    assert {f.path: f.status for f in shown.files} == {
        "sglang/srt/a.py": "M", "sglang/srt/b.py": "D", "sglang/srt/c.py": "T", "sglang/srt/extra.py": "A"}
    assert shown.nodes == ("ct200",)
    assert stat.S_IMODE(shown.files[2].patch.mode) == 0o700  # type: ignore[union-attr]
    # The node already holds it: pushing it there has nothing to do.
    pushed = run_snapver("push", "hotfix", "--yes")
    assert pushed.code == 0 and "nothing to do" in pushed.out, pushed
    assert "refs/heads/pushes" not in sh("git", "--git-dir", str(store), "for-each-ref").decode()


def test_rebase_carries_a_patch_to_a_new_base(make_site_packages, write_config, local_node, run_snapver,
                                              isolated_env):
    numbers = "".join(f"line {n}\n" for n in range(1, 31))
    site = make_site_packages("node", files={"sglang/srt/a.py": numbers, "sglang/srt/b.py": "b\n",
                                             "sglang/srt/c.py": "c\n"})
    config_path = write_config({"node": local_node(site)})
    config, snapver_store = snapshot(config_path, "node", "v1")
    v1 = {rel: (site / rel).read_bytes() for rel in ("sglang/srt/a.py", "sglang/srt/b.py", "sglang/srt/c.py")}
    # Patches made on v1.
    import_patch(snapver_store, config, "fix", b"--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -2,3 +2,3 @@\n"
                 b" line 2\n-line 3\n+line 3 patched\n line 4\n--- a/sglang/srt/c.py\n+++ b/sglang/srt/c.py\n"
                 b"@@ -1 +1 @@\n-c\n+c fixed\n", "fix.diff", "v1")
    import_patch(snapver_store, config, "clash", b"--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n"
                 b"@@ -25,3 +25,3 @@\n line 25\n-line 26\n+line 26 mine\n line 27\n", "clash.diff", "v1")
    # The next release: a.py changed far from line 3 (and at line 26), c.py got the same fix.
    (site / "sglang/srt/a.py").write_text(numbers.replace("line 26\n", "line 26 upstream\n"))
    (site / "sglang/srt/c.py").write_text("c fixed\n")
    (site / "sglang/srt/b.py").write_text("b v2\n")
    snapshot(config_path, "node", "v2")

    result = run_snapver("patch", "rebase", "fix", "--onto", "v2")
    assert result.code == 0, result
    assert "merged" in result.out and "dropped" in result.out
    store = isolated_env / "snapshots"
    v2_commit = sh("git", "--git-dir", str(store), "rev-parse", "refs/tags/v2").decode().strip()
    assert meta(store, PATCH_REF + "fix")["base"] == v2_commit
    got = store_files(store, PATCH_REF + "fix")
    assert got["sglang/srt/a.py"][1] == numbers.replace("line 3\n", "line 3 patched\n").replace(
        "line 26\n", "line 26 upstream\n").encode()
    assert got["sglang/srt/b.py"][1] == b"b v2\n"
    assert [f.path for f in load_patch(snapver_store, "fix").files] == ["sglang/srt/a.py"]  # c.py is in v2

    # A conflict: reported per file, exit 1, the patch untouched, the merge checked out.
    before = sh("git", "--git-dir", str(store), "rev-parse", PATCH_REF + "clash")
    result = run_snapver("patch", "rebase", "clash", "--onto", "v2")
    assert result.code == 1, result
    assert "conflict" in result.out and "sglang/srt/a.py" in result.out
    assert sh("git", "--git-dir", str(store), "rev-parse", PATCH_REF + "clash") == before
    folder = isolated_env / ".snapver-patches" / "clash"
    merged = (folder / "sglang/srt/a.py").read_text()
    assert "<<<<<<< clash" in merged and "line 26 upstream" in merged and "line 26 mine" in merged
    (folder / "sglang/srt/a.py").write_text(numbers.replace("line 26\n", "line 26 upstream and mine\n"))
    saved = run_snapver("patch", "save", "clash")
    assert saved.code == 0, saved
    assert meta(store, PATCH_REF + "clash")["base"] == v2_commit
    assert store_files(store, PATCH_REF + "clash")["sglang/srt/a.py"][1] == numbers.replace(
        "line 26\n", "line 26 upstream and mine\n").encode()
    # The rebased patch exports against v2: patch -p1 on the v2 files gives the same content.
    exported = export_patch(snapver_store, "fix")
    target = isolated_env / "apply"
    copy_files(site, target, ["sglang/srt/a.py"])
    sh("patch", "-p1", "--batch", "--quiet", cwd=target, input=exported)
    assert (target / "sglang/srt/a.py").read_bytes() == got["sglang/srt/a.py"][1]
    assert v1  # the v1 content was only the starting point
    assert hashlib.sha256(got["sglang/srt/a.py"][1]).hexdigest() != hashlib.sha256(v1["sglang/srt/a.py"]).hexdigest()


def test_rebase_conflict_without_markers_keeps_the_patch_side(make_site_packages, write_config, local_node,
                                                               run_snapver, isolated_env):
    """A modify/delete (either way), binary or symlink conflict has no markers to show both
    sides: the checkout holds the patch's side, so a save that leaves it alone keeps the
    patch's change instead of silently taking the new base's."""
    v1 = {"sglang/srt/changed.py": "c = 1\n", "sglang/srt/deleted.py": "d = 1\n",
          "sglang/srt/blob.bin": b"\x00v1", "sglang/srt/y.py": "y = 1\n",
          "sglang/srt/t1.py": "", "sglang/srt/t2.py": ""}
    site = make_site_packages("node", files=v1)
    os.symlink("t1.py", site / "sglang/srt/link")
    config_path = write_config({"node": local_node(site)})
    snapshot(config_path, "node", "v1")
    folder = Path(run_snapver("patch", "new", "md", "--base", "v1").out.strip().splitlines()[-1])
    srt = folder / "sglang/srt"
    (srt / "changed.py").write_text("c = 9  # the patch\n")
    (srt / "deleted.py").unlink()
    (srt / "blob.bin").write_bytes(b"\x00mine")
    (srt / "link").unlink()
    os.symlink("t2.py", srt / "link")
    (srt / "y.py").write_text("y = 1  # the patch\n")
    assert run_snapver("patch", "save", "md").code == 0
    # The next release deletes what the patch changed, changes what it deleted, and
    # changes the binary file, the link and y.py too.
    (site / "sglang/srt/changed.py").unlink()
    (site / "sglang/srt/deleted.py").write_text("d = 2  # upstream\n")
    (site / "sglang/srt/blob.bin").write_bytes(b"\x00theirs")
    (site / "sglang/srt/link").unlink()
    os.symlink("y.py", site / "sglang/srt/link")
    (site / "sglang/srt/y.py").write_text("y = 2\n")
    snapshot(config_path, "node", "v2")

    rebased = run_snapver("patch", "rebase", "md", "--onto", "v2")
    assert rebased.code == 1, rebased
    conflicts = {line.split()[1].rstrip(":") for line in rebased.out.splitlines() if line.split()[0] == "conflict"}
    assert conflicts == {"sglang/srt/changed.py", "sglang/srt/deleted.py", "sglang/srt/blob.bin",
                         "sglang/srt/link", "sglang/srt/y.py"}, rebased
    assert (srt / "changed.py").read_text() == "c = 9  # the patch\n"
    assert not (srt / "deleted.py").exists()
    assert (srt / "blob.bin").read_bytes() == b"\x00mine"
    assert os.readlink(srt / "link") == "t2.py"
    # Only the content conflict is resolved; the save keeps the patch's side of the others.
    (srt / "y.py").write_text("y = 2  # the patch\n")
    saved = run_snapver("patch", "save", "md")
    assert saved.code == 0, saved
    store = isolated_env / "snapshots"
    v2 = sh("git", "--git-dir", str(store), "rev-parse", "refs/tags/v2").decode().strip()
    assert meta(store, PATCH_REF + "md")["base"] == v2
    got = store_files(store, PATCH_REF + "md")
    assert got["sglang/srt/changed.py"] == ("100644", b"c = 9  # the patch\n")
    assert "sglang/srt/deleted.py" not in got
    assert got["sglang/srt/blob.bin"][1] == b"\x00mine"
    assert got["sglang/srt/link"] == ("120000", b"t2.py")
    assert got["sglang/srt/y.py"][1] == b"y = 2  # the patch\n"
    assert {f.path: f.status for f in load_patch(Store(store), "md").files} == {
        "sglang/srt/changed.py": "A", "sglang/srt/deleted.py": "D", "sglang/srt/blob.bin": "M",
        "sglang/srt/link": "M", "sglang/srt/y.py": "M"}


def test_import_names_refused(small):
    _, _, config, store = small
    good = b"--- a/sglang/srt/a.py\n+++ b/sglang/srt/a.py\n@@ -1 +1 @@\n-one\n+ONE\n"
    with pytest.raises(UsageError, match="invalid patch name"):
        import_patch(store, config, "bad name", good, "x", "small")
    with pytest.raises(RefError, match="unknown ref"):
        import_patch(store, config, "p", good, "x", "no-such-ref")
    with pytest.raises(UsageError, match="unknown node or group"):
        import_patch(store, config, "p", good, "x", "small", nodes=["ghost"])
    assert import_patch(store, config, "p", good, "x", "small").files[0].path == "sglang/srt/a.py"
    with pytest.raises(UsageError, match="already exists"):
        import_patch(store, config, "p", good, "x", "small")
