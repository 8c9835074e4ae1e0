"""store/loose.py: a blob written in pieces as a loose object is what git reads and checks."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import blake3
import pytest

from snapver.store.blobpack import BlobPack
from snapver.store.loose import write_loose_blob


def git(repo: Path, *args: str, input: bytes | None = None) -> bytes:  # noqa: A002
    done = subprocess.run(["git", "--git-dir", str(repo), *args], input=input, capture_output=True)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    subprocess.run(["git", "init", "-q", "--bare", str(path)], check=True)
    return path


def cut(data: bytes, sizes: list[int]) -> list[bytes]:
    """``data`` in pieces of the given sizes, round and round."""
    pieces, start, index = [], 0, 0
    while start < len(data):
        size = sizes[index % len(sizes)]
        pieces.append(data[start:start + size])
        start += size
        index += 1
    return pieces


# Sizes around the stored blocks' edges (65,535 bytes of "blob N\0" + content each).
@pytest.mark.parametrize("size", [0, 1, 65535 - 8, 65535 - 9, 65535 * 2 - 11, 3 * (1 << 20) + 5])
def test_a_blob_written_in_pieces_is_the_object_git_names(repo: Path, size: int) -> None:
    data = os.urandom(size)
    digest = blake3.blake3()
    blob = write_loose_blob(repo / "objects", size, cut(data, [1, 70000, 65535, 1 << 20, 3]), [digest])
    oid = git(repo, "hash-object", "--stdin", input=data).decode().strip()
    assert blob.oid == oid and digest.hexdigest() == blake3.blake3(data).hexdigest()
    assert not (repo / "objects" / oid[:2]).exists()  # nothing visible before it is placed
    blob.place()
    assert git(repo, "cat-file", "blob", oid) == data
    git(repo, "fsck", "--full", "--strict")
    assert not list((repo / "objects" / "pack").iterdir())  # its temporary took its place


@pytest.mark.parametrize("delivered", [9, 11])
def test_content_longer_or_shorter_than_announced_is_refused_and_leaves_nothing(repo: Path, delivered: int) -> None:
    with pytest.raises(ValueError):
        write_loose_blob(repo / "objects", 10, [b"x" * delivered])
    assert not list((repo / "objects" / "pack").iterdir())


def test_a_failing_stream_leaves_nothing(repo: Path) -> None:
    def pieces():
        yield b"half"
        raise ConnectionError("cut")

    with pytest.raises(ConnectionError):
        write_loose_blob(repo / "objects", 8, pieces())
    assert not list((repo / "objects" / "pack").iterdir())


# A pack's stream holds the content alone: its blocks end at 65,535 bytes of content.
@pytest.mark.parametrize("size", [0, 1, 65535, 65536, 65535 * 2 + 1, 3 * (1 << 20) + 5])
def test_a_blob_written_in_pieces_as_a_pack_of_its_own_is_the_object_git_names(repo: Path, size: int) -> None:
    """blobpack.BlobPack (the compaction's rewrite of a big loose blob) shares the loose writer's stream."""
    data = os.urandom(size)
    blob = BlobPack(repo / "objects", size)
    for piece in cut(data, [1, 70000, 65535, 1 << 20, 3]):
        blob.write(piece)
    oid = blob.close()
    assert oid == git(repo, "hash-object", "--stdin", input=data).decode().strip()
    assert not list((repo / "objects" / "pack").glob("*.idx"))  # nothing visible before it is placed
    blob.place()
    assert git(repo, "cat-file", "blob", oid) == data
    git(repo, "fsck", "--full", "--strict")
    (index,) = (repo / "objects" / "pack").glob("*.idx")
    git(repo, "verify-pack", str(index))
