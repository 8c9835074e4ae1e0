"""The agent's read_stable (one os.read() per file) and hash_stable (CHUNK pieces): the whole file whatever
happened to it since it was listed (grown, shrunk, replaced), never a short or padded read."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from types import ModuleType

import pytest

from snapver.transport.agent import assemble


@pytest.fixture(scope="module")
def agent() -> ModuleType:
    module = ModuleType("agent_under_test")  # not "snapver_agent": that serves
    exec(compile(assemble(), "snapver-agent", "exec"), module.__dict__)  # the script the node runs
    return module


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def taken_whole(agent: ModuleType, how: str, path: Path, listed: os.stat_result, content: bytes) -> os.stat_result:
    """read_stable ("read") or hash_stable ("hash") of path, checked against content; its stat."""
    if how == "read":
        read, after = agent.read_stable(str(path), listed)
        assert read == content
    else:
        digest, after = agent.hash_stable(str(path), listed)
        assert digest == git_blob_id(content)
    return after


def test_a_file_as_listed_is_read_whole(agent: ModuleType, tmp_path: Path) -> None:
    for name, data in (("empty", b""), ("small", b"x = 1\n"), ("big", os.urandom(3 << 20) + b"end")):
        path = tmp_path / name
        path.write_bytes(data)
        read, after = agent.read_stable(str(path), os.lstat(path))
        assert read == data and after.st_size == len(data)


@pytest.mark.parametrize("how", ["read", "hash"])
@pytest.mark.parametrize("change", ["grown", "shrunk", "replaced", "emptied"])
def test_a_file_changed_since_listed_is_taken_whole_as_it_is_now(agent: ModuleType, tmp_path: Path,
                                                                 change: str, how: str) -> None:
    """read_stable reads it, hash_stable (CHUNK pieces) hashes it: as it is now, whole."""
    size = agent.CHUNK + 5000
    path = tmp_path / "f.py"
    path.write_bytes(b"a" * size)
    listed = os.lstat(path)
    new = {"grown": b"a" * size + b"b" * 70000, "shrunk": b"a" * 10, "emptied": b"", "replaced": b"c" * size}[change]
    if change == "replaced":  # same size, another inode
        (tmp_path / "tmp").write_bytes(new)
        os.replace(tmp_path / "tmp", path)
    else:
        path.write_bytes(new)
    after = taken_whole(agent, how, path, listed, new)
    assert (after.st_ino, after.st_size) == (os.lstat(path).st_ino, len(new))


def test_a_folder_in_place_of_a_file_is_an_error(agent: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "f.py"
    path.write_bytes(b"x")
    listed = os.lstat(path)
    path.unlink()
    path.mkdir()
    with pytest.raises(OSError):
        agent.read_stable(str(path), listed)


def test_hashing_a_file_as_listed_gives_its_git_blob_id(agent: ModuleType, tmp_path: Path) -> None:
    """hash_stable reads in CHUNK pieces: sizes around a piece's edges hash like the whole."""
    chunk = agent.CHUNK
    for size in (0, 1, chunk - 1, chunk, chunk + 1, 3 * chunk + 17):
        path = tmp_path / f"f{size}"
        data = os.urandom(size)
        path.write_bytes(data)
        digest, after = agent.hash_stable(str(path), os.lstat(path))
        assert digest == git_blob_id(data), size
        assert after.st_size == size
        assert agent.hash_stable(str(path), os.lstat(path), "sha256")[0] == hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("how", ["read", "hash"])
def test_a_file_swapped_for_a_link_after_its_lstat_is_never_followed(agent: ModuleType, tmp_path: Path,
                                                                     how: str) -> None:
    """Listed (lstat) as a regular file, a link to a root-only file by the time it is opened:
    the read (pull) and the hash (push's check and its compare-and-swap at the rename) fail
    on that file and never take the linked file's content or id."""
    secret = tmp_path / "root-only"
    secret.write_bytes(b"root's secret\n")
    path = tmp_path / "x.py"
    path.write_bytes(b"public = 1\n")
    listed = os.lstat(path)
    path.unlink()
    path.symlink_to(secret)
    taken = agent.read_stable if how == "read" else agent.hash_stable
    with pytest.raises(OSError):
        taken(str(path), listed)


class ShortReads:
    """Stands in for the agent's ``os``: read() gives at most 1000 bytes, readv() 700."""

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    @staticmethod
    def read(fd: int, size: int) -> bytes:
        return os.read(fd, min(size, 1000))

    @staticmethod
    def readv(fd: int, buffers: list[memoryview]) -> int:
        return os.readv(fd, [buffers[0][:700]])


@pytest.mark.parametrize("how", ["read", "hash"])
def test_reads_cut_short_still_take_the_whole_file(agent: ModuleType, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    """read() returns at most 2 GiB - 4 KiB on Linux, and a read may return less than asked
    before the end (a signal, some file systems): the file must still come whole, not be
    retried as 'changing' forever nor cut."""
    path = tmp_path / "big.so"
    data = os.urandom(5000)
    path.write_bytes(data)
    listed = os.lstat(path)
    monkeypatch.setattr(agent, "os", ShortReads())
    assert taken_whole(agent, how, path, listed, data).st_size == 5000


class Sleeps:
    """Stands in for the agent's ``time``: records sleeps instead of sleeping."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def __getattr__(self, name: str) -> object:
        import time

        return getattr(time, name)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)


def test_a_fresh_file_settles_unless_it_holds_the_expected_content(agent: ModuleType, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A file changed less than SETTLE_NS ago may be half-way through a rewrite: it is read
    again once it stayed the same that long. One that hashes to the content the agent
    itself just wrote is whole: taken at once (a push's verify and after-snapshot)."""
    clock = Sleeps()
    monkeypatch.setattr(agent, "time", clock)
    path = tmp_path / "fresh.py"
    data = b"x = 2\n"
    path.write_bytes(data)  # ctime: now
    assert agent.hash_stable(str(path), os.lstat(path))[0] == git_blob_id(data)
    assert len(clock.slept) == 1 and 0 < clock.slept[0] <= agent.SETTLE_NS / 1e9
    assert agent.hash_stable(str(path), os.lstat(path), expect=git_blob_id(data))[0] == git_blob_id(data)
    assert agent.hash_stable(str(path), os.lstat(path), expect=git_blob_id(b"other"))[0] == git_blob_id(data)
    assert len(clock.slept) == 2  # the expected content: no wait; other content: waits as before
