"""A folder read as a node (``FolderTransport``): every path it hands out or takes is the
tracked path the folder's paths stand for. Checked against the files read here."""

from __future__ import annotations

import hashlib
import inspect
import os
from pathlib import Path

from snapver.config import parse_config
from snapver.transport.agent.wire import BIG_FILE
from snapver.transport.base import StreamedFile, Transport
from snapver.transport.local import FolderTransport

ROOTS = (("checkout", "sglang/srt"),)  # (on disk, tracked)


def folder_transport(site: Path, tmp_path: Path) -> FolderTransport:
    table = {"local": True, "site_packages": str(site), "paths": ["checkout"]}
    spec = parse_config({"nodes": {"n": table}}, tmp_path / ".snapver").nodes["n"]
    return FolderTransport(spec, ROOTS)


def test_every_method_that_takes_paths_renames_them() -> None:
    """Each method of the interface with a ``paths`` argument, or that hands out paths, is
    FolderTransport's own (a method added to the interface later must be renamed too)."""
    hands_out = {"list_tree", "request_listing", "request_listed_files"}
    takes = {name for name in Transport.__abstractmethods__ if callable(getattr(Transport, name))
             and "paths" in inspect.signature(getattr(Transport, name)).parameters}
    assert takes >= {"read_files", "stream_files", "hash_files"}
    for name in takes | hands_out - {"list_tree"}:  # list_tree asks request_listing
        assert name in vars(FolderTransport), name


def test_a_folder_speaks_tracked_paths_in_every_method(tmp_path: Path) -> None:
    site = tmp_path / "site"
    folder = site / "checkout"
    (folder / "sub").mkdir(parents=True)
    small, big = b"a = 1\n", os.urandom(BIG_FILE + 5000)  # big: streamed in pieces
    (folder / "sub" / "a.py").write_bytes(small)
    (folder / "big.bin").write_bytes(big)
    os.symlink("sub/a.py", folder / "link")
    content = {"sglang/srt/sub/a.py": small, "sglang/srt/big.bin": big, "sglang/srt/link": b"sub/a.py"}
    with folder_transport(site, tmp_path) as transport:
        assert {entry.path for entry in transport.list_tree().entries} == set(content)
        assert {path: data for path, _, data in transport.read_files(sorted(content))} == content
        streamed = {}
        for path, _, data in transport.stream_files(sorted(content)):
            streamed[path] = b"".join(data) if isinstance(data, StreamedFile) else data
        assert streamed == content
        waiting = transport.request_listing()
        stream = transport.request_listed_files()
        listed = [entry.path for entry in waiting().entries]
        assert sorted(listed) == sorted(content)
        assert {path for path, _, _ in stream(listed)} == set(content)  # pieces left unread are drained
        assert transport.hash_files(["sglang/srt/sub/a.py", "sglang/srt/gone.py"]) == {
            "sglang/srt/sub/a.py": hashlib.sha256(small).hexdigest(), "sglang/srt/gone.py": None}
