"""The store at its limits: damage that makes git stall, a store that cannot be written, a
compaction that runs out of disk. Each ends in bounded time with one clear line and exit 4,
and leaves nothing behind that eats the disk.

Damage is made for real: a pack truncated to half (as a disk that filled up while copying
the store would leave it), an object file that is a FIFO (git's open of it never returns),
a tmpfs remounted read-only (chmod does not stop root, which the suite runs as), a tmpfs
filled up.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from faultkit import all_refs, assert_store_sound, git, loosen_objects

from snapver.store import gc

SRT = "sglang/srt"


def pack_files(store: Path, pattern: str) -> list[Path]:
    return sorted((store / "objects" / "pack").glob(pattern))


@pytest.fixture
def two_pulls(make_site_packages, local_node, write_config, run_snapver, store) -> Path:
    """A store whose first pack holds 1,500 blobs and whose second (newest snapshot) one changed file.

    Truncating the first pack leaves the newest snapshot's commit, trees and manifest readable
    and 1,499 of its blobs not: git prints a line on stderr for each one it cannot read.
    """
    files = {f"{SRT}/m{i // 100}/f{i}.py": f"value = {i}\n" * 3 for i in range(1500)}
    site = make_site_packages("n1", files=files)
    write_config({"n1": local_node(site)})
    assert run_snapver("pull", "n1").code == 0
    (site / SRT / "m0" / "f0.py").write_text("value = 'changed'\n")
    assert run_snapver("pull", "n1").code == 0
    assert len(pack_files(store, "pack-*.pack")) == 2
    return store


def test_fsck_of_a_pack_truncated_to_half_ends_and_names_it(two_pulls: Path, snapver_process) -> None:
    store = two_pulls
    first = max(pack_files(store, "pack-*.pack"), key=lambda p: p.stat().st_size)
    first.chmod(0o644)
    os.truncate(first, first.stat().st_size // 2)
    started = time.monotonic()
    # A process of its own, bounded: the unread stderr pipe used to block `git cat-file`, and
    # fsck with it, forever (run_process raises TimeoutExpired then).
    result = snapver_process("fsck", timeout=60)
    assert time.monotonic() - started < 30
    assert result.code == 4, str(result)
    assert "Traceback" not in result.err and "internal error" not in result.err
    assert f"{first.name} does not match index" in result.err  # git's own words, on the damaged pack
    assert re.search(r"snapshot \w{10} \(n1\): 'sglang/srt/m\d+/f\d+\.py': object \w{40} is missing", result.err)
    assert result.err.rstrip().splitlines()[-2].startswith("snapver: error: the store has ")


def _replace_object_with_fifo(store: Path, rev: str) -> str:
    """Unpack every object loose (git refuses to unpack objects it has), then make one a FIFO."""
    oid = git(store, "rev-parse", rev).decode().strip()
    loosen_objects(store)
    loose = store / "objects" / oid[:2] / oid[2:]
    loose.unlink()
    os.mkfifo(loose)
    return oid


def test_a_git_that_stalls_is_killed_after_the_timeout(small_site, local_node, write_config, run_snapver, store,
                                                       snapver_process) -> None:
    write_config({"n1": local_node(small_site)})
    assert run_snapver("pull", "n1").code == 0
    _replace_object_with_fifo(store, f"refs/heads/nodes/n1:{SRT}/server_args.py")
    env = {"SNAPVER_GIT_TIMEOUT": "2"}
    for args, words in ((("fsck",), "git fsck did not finish within 2 s"),
                        (("show", "n1", f"{SRT}/server_args.py"), "git cat-file did not answer within 2 s")):
        started = time.monotonic()
        result = snapver_process(*args, env=env, timeout=60)
        assert time.monotonic() - started < 20, args
        assert result.code == 4, str(result)
        lines = result.err.strip().splitlines()
        assert lines[0].startswith("snapver: error: ") and words in lines[0], str(result)
        assert lines[1].startswith("hint: ") and "SNAPVER_GIT_TIMEOUT" in lines[1]
        assert len(lines) == 2


@pytest.fixture
def read_only_store(small_disk: Path, small_site, local_node, write_config, run_snapver) -> Path:
    """A store on a tmpfs remounted read-only after one pull (root ignores modes, not a ro mount)."""
    store = small_disk / "snapshots"
    write_config({"n1": local_node(small_site)}, store=str(store))
    assert run_snapver("pull", "n1").code == 0
    (small_site / SRT / "server_args.py").write_text("port = 1\n")
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    try:
        yield store
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(small_disk)], check=False)


@pytest.mark.parametrize("args", [("pull", "n1"), ("tag", "before-fix", "n1"),
                                  ("patch", "new", "fix", "--base", "n1")], ids=["pull", "tag", "patch new"])
def test_a_read_only_store_is_refused_in_words(read_only_store: Path, run_snapver, args) -> None:
    before = all_refs(read_only_store)
    result = run_snapver(*args)
    assert result.code == 4, str(result)
    assert result.err.splitlines() == [
        f"snapver: error: cannot write to the store {read_only_store}: Read-only file system",
        "hint: the store is on a read-only file system: remount it read-write, or point [store] path elsewhere"]
    assert all_refs(read_only_store) == before
    # Reading still works.
    assert run_snapver("log").code == 0 and run_snapver("status", "n1").code == 1


def _fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` up to ``leave`` free bytes."""
    stats = os.statvfs(disk)
    filler = disk / "filler"
    filler.write_bytes(b"\0" * max(0, stats.f_bavail * stats.f_frsize - leave))
    return filler


def test_a_compaction_that_fills_the_disk_leaves_no_temporary_pack(small_disk: Path, make_site_packages,
                                                                   local_node, write_config, run_snapver) -> None:
    store = small_disk / "snapshots"
    site = make_site_packages("n1", files={f"{SRT}/w{i}.bin": os.urandom(200_000) for i in range(6)})
    write_config({"n1": local_node(site)}, store=str(store))
    assert run_snapver("pull", "n1").code == 0
    before = all_refs(store)
    filler = _fill(small_disk, 400_000)  # room for part of the repacked store only
    assert gc.compact(store) != 0  # git repack: "No space left on device"
    assert pack_files(store, "tmp_*") == []  # its half-written pack was removed at once
    filler.unlink()
    assert_store_sound(store, run_snapver, before)


def test_a_temporary_pack_left_by_a_killed_compaction_goes_with_the_next_write(
        small_disk: Path, make_site_packages, local_node, write_config, run_snapver) -> None:
    store = small_disk / "snapshots"
    site = make_site_packages("n1", files={f"{SRT}/w{i}.bin": os.urandom(200_000) for i in range(6)})
    write_config({"n1": local_node(site)}, store=str(store))
    assert run_snapver("pull", "n1").code == 0
    filler = _fill(small_disk, 400_000)
    # The repack a compaction runs, on its own: what a compaction killed before it could
    # clean up leaves (git removes nothing when its write fails).
    done = subprocess.run(["git", "--git-dir", str(store), "-c", "pack.compression=1", "repack", "-a", "-d", "-k",
                           "-F", "-q"], capture_output=True, text=True)
    assert done.returncode != 0 and "Out of diskspace" in done.stderr, done.stderr
    (leftover,) = pack_files(store, "tmp_pack_*")
    filler.unlink()
    # A leftover just written could be a live writer's; one untouched for a minute, open in no
    # process, is not (the clock is moved, not waited for).
    an_hour_ago = time.time() - 3600
    os.utime(leftover, (an_hour_ago, an_hour_ago))
    (site / SRT / "w0.bin").write_bytes(b"changed")
    assert run_snapver("pull", "n1").code == 0
    assert pack_files(store, "tmp_*") == []
    # A fresh one (a writer that may be alive) is left alone.
    young = store / "objects" / "pack" / "tmp_pack_AbCdEf"
    young.write_bytes(b"PACK")
    (site / SRT / "w1.bin").write_bytes(b"changed too")
    assert run_snapver("pull", "n1").code == 0
    assert young.exists()
