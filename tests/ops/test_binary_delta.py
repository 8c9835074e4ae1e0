"""`patch import` of git's binary `delta` hunks (issue 14, reproduction 2): a real
`git diff --binary` between two trees with a changed shared object is imported, and the
patched blob equals the changed file byte for byte (read back with git); a base whose
blob is not the one the `index` line names is a conflict naming the file. Real sshd."""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import git_blob, git_ls_tree

from snapver.errors import PatchError
from snapver.unidiff import apply_delta

SO = "sglang/srt/kernels/_C.so"
MOD = "sglang/srt/kernels/load.py"
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}


def sh(*args: str, cwd: Path) -> bytes:
    done = subprocess.run(list(args), cwd=cwd, capture_output=True, env={**os.environ, **GIT_ENV})
    assert done.returncode == 0, done.stderr
    return done.stdout


def shared_object(seed: int = 14) -> bytes:
    """An ELF-looking blob: a header, then 96 KiB that compress badly (so git picks a delta)."""
    rng = random.Random(seed)
    return b"\x7fELF\x02\x01\x01" + b"\0" * 9 + bytes(rng.getrandbits(8) for _ in range(96 << 10))


def changed(data: bytes) -> bytes:
    out = bytearray(data)
    out[5000:5016] = b"\xde\xad\xbe\xef" * 4  # a patched constant
    out[70000:70003] = b"\x90\x90\x90"
    return bytes(out) + b"\0tail"


@pytest.fixture
def setup(sshd, ssh_node, make_site_packages, write_config, run_snapver, tmp_path: Path):
    original = shared_object()
    site = make_site_packages("ct200", files={SO: original, MOD: "import ctypes\n"})
    write_config({"ct200": ssh_node("ct200", site)}, where=tmp_path)
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0
    # Two trees, as two unpacked releases: git diff --binary between them.
    work = tmp_path / "src"
    for rel, data in ((SO, original), (MOD, b"import ctypes\n")):
        (work / rel).parent.mkdir(parents=True, exist_ok=True)
        (work / rel).write_bytes(data)
    sh("git", "init", "-q", cwd=work)
    sh("git", "add", "-A", cwd=work)
    sh("git", "commit", "-qm", "0.5.23", cwd=work)
    new = changed(original)
    (work / SO).write_bytes(new)
    (work / MOD).write_bytes(b"import ctypes\nLIB = '_C.so'\n")
    patch = sh("git", "diff", "--binary", cwd=work)
    assert b"GIT binary patch\ndelta " in patch  # git chose a delta: what is under test
    (tmp_path / "so.diff").write_bytes(patch)
    return site, original, new


def test_binary_delta_is_applied_byte_for_byte(setup, run_snapver, tmp_path: Path) -> None:
    site, original, new = setup
    result = run_snapver("patch", "import", "so", "so.diff", "--base", "ct200", cwd=tmp_path)
    assert result.code == 0, result
    store = tmp_path / "snapshots"
    tree = git_ls_tree(store, "refs/heads/patches/so")
    assert git_blob(store, tree[SO][1]) == new
    assert git_blob(store, tree[MOD][1]) == b"import ctypes\nLIB = '_C.so'\n"
    assert run_snapver("push", "so", "ct200", "--yes", cwd=tmp_path).code == 0
    assert (site / SO).read_bytes() == new


def test_binary_delta_against_another_blob_is_a_conflict(setup, run_snapver, tmp_path: Path) -> None:
    site, original, new = setup
    (site / SO).write_bytes(shared_object(seed=15))  # another build on the node
    assert run_snapver("pull", "ct200", cwd=tmp_path).code == 0
    result = run_snapver("patch", "import", "so", "so.diff", "--base", "ct200", cwd=tmp_path)
    assert result.code == 1, result
    assert f"{SO}: conflict: the binary delta was made against blob" in result.err
    assert "refs/heads/patches/so" not in subprocess.run(
        ["git", "--git-dir", str(tmp_path / "snapshots"), "for-each-ref"], capture_output=True, text=True).stdout


def test_apply_delta_refuses_what_it_cannot_do_exactly() -> None:
    # source 3 bytes, result 5: copy 3 from 0, insert "xy"
    delta = bytes([3, 5, 0x80 | 0x01 | 0x10, 0, 3, 2]) + b"xy"
    assert apply_delta("f", b"abc", delta) == b"abcxy"
    with pytest.raises(PatchError, match="past its source"):
        apply_delta("f", b"abc", bytes([3, 5, 0x80 | 0x01 | 0x10, 1, 3, 2]) + b"xy")
    with pytest.raises(PatchError, match="reserved"):
        apply_delta("f", b"abc", bytes([3, 3, 0]))
    with pytest.raises(PatchError, match="not the 6"):
        apply_delta("f", b"abc", bytes([3, 6, 0x80 | 0x01 | 0x10, 0, 3]))
    assert shutil.which("git")
