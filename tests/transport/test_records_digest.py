"""The node checks a re-pull's stat keys as a whole first (agent ``_Records``).

The client sends its keys with the BLAKE2b of their records, sorted; the agent hashes its
own files' records the same way and decodes the keys only when the two differ. These
tests run the agent's ``list`` in this process, on real folders, through a real
``Channel`` (the frames in memory): what it answers must be what decoding every record
answers — a tree as it was is "all same" without the keys ever being read; any change is
found and hashed; a folder swapped for a link before the changed files are read fails
the listing, never followed.
"""

from __future__ import annotations

import io
import json
import os
import struct
import time
import zlib
from pathlib import Path

import pytest

from snapver.ops.live import records_digest, records_text
from snapver.store.objects import blob_oid
from snapver.transport.agent import listing, wire

FILES = {f"pkg/m{i}.py": f"value = {i}\n" for i in range(12)} | {"pkg/sub/deep.py": "deep = 1\n",
                                                                  "pkg/sub/caf\u00e9 x.py": "x = 1\n"}


@pytest.fixture
def site(tmp_path: Path) -> Path:
    root = tmp_path / "site-packages"
    for rel, text in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    old = time.time_ns() - 10 * 10**9  # older than the racy window of a cache made now
    for rel in FILES:
        os.utime(root / rel, ns=(old, old))
    return root


def _records(site: Path) -> str:
    """The records a pull keeps of the tree as it is now (``records_text``)."""
    keys = []
    for rel in FILES:
        st = os.lstat(site / rel)
        if os.path.isfile(site / rel):
            keys.append((rel, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode))
    return records_text(keys)


def _cache_time() -> int:
    """A cache time that trusts every file made so far (none is in its racy window)."""
    return time.time_ns() + 3 * 10**9


def _list(site: Path, frame: bytes, digest: str | None, cache_time_ns: int) -> dict:
    """The agent's ``list`` reply to a delta request whose keys are ``frame``."""
    return _list_on(site, frame, digest, cache_time_ns)[0]


def _list_on(site: Path, frame: bytes, digest: str | None, cache_time_ns: int) -> tuple[dict, wire.Channel]:
    """``_list``, and the channel it ran on (its ``listed`` paths)."""
    wire_in = io.BytesIO(struct.pack(">I", len(frame)) + frame)
    wire_out = io.BytesIO()
    request = {"op": "list", "paths": ["pkg"], "exclude": [], "cache_time_ns": cache_time_ns, "oids": True,
               "delta": True, "cache_frame": True, "site_packages": str(site)}
    if digest is not None:
        request.update(records_digest=digest, records=len(FILES))
    channel = wire.Channel(wire_in, wire_out)
    listing.op_list(channel, request)
    data = wire_out.getvalue()
    (size,) = struct.unpack(">I", data[:4])
    body = data[4:]
    return json.loads(zlib.decompress(body) if size & wire.SQUEEZED else body), channel


def _between_walk_and_reads(monkeypatch, change) -> None:
    """Run ``change`` once the walk is done, before the files taken as unchanged are checked."""
    real_check = listing._Records.all_found

    def change_then_check(self):
        change()
        return real_check(self)

    monkeypatch.setattr(listing._Records, "all_found", change_then_check)


def _frame(records: str) -> bytes:
    return zlib.compress(json.dumps(records).encode("ascii"))


def test_a_tree_as_it_was_is_all_same_without_the_keys_being_read(site: Path) -> None:
    records = _records(site)
    # The frame is garbage: were it decoded, no record would be found and every file hashed.
    reply = _list(site, b"not zlib at all", records_digest(records), _cache_time())
    assert (reply["same"], reply["entries"], reply["gone"], reply["hashed"]) == (len(FILES), [], [], 0)


def test_the_same_tree_with_the_keys_decoded_answers_the_same(site: Path) -> None:
    records = _records(site)
    with_digest = _list(site, _frame(records), records_digest(records), _cache_time())
    without = _list(site, _frame(records), None, _cache_time())
    assert with_digest == {**without, "now_ns": with_digest["now_ns"]}


@pytest.mark.parametrize("change", ["edit", "add", "delete", "touch"])
def test_any_change_is_found_and_only_it_is_hashed(site: Path, change: str) -> None:
    records = _records(site)
    target = site / "pkg/m3.py"
    if change == "edit":
        before = target.stat()
        target.write_text("value = 9\n")  # same size, same mtime: only ctime moves
        os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))
    elif change == "add":
        target = site / "pkg/sub/new.py"
        target.write_text("new = 1\n")
    elif change == "delete":
        target.unlink()
    else:
        os.utime(target, ns=(target.stat().st_atime_ns, target.stat().st_mtime_ns - 10**9))
    time.sleep(0.01)
    reply = _list(site, _frame(records), records_digest(records), _cache_time())
    baseline = _list(site, _frame(records), None, _cache_time())
    assert reply == {**baseline, "now_ns": reply["now_ns"]}
    rel = str(target.relative_to(site))
    if change == "delete":
        assert (reply["entries"], reply["gone"], reply["same"]) == ([], [rel], len(FILES) - 1)
        return
    [row] = reply["entries"]
    assert row[0] == rel and row[7] == blob_oid(target.read_bytes()) and reply["hashed"] == 1
    assert reply["gone"] == [] and reply["same"] == len(FILES) - (change != "add")


def test_a_folder_swapped_for_a_link_before_the_changed_files_are_read_is_never_followed(
        site: Path, tmp_path: Path, monkeypatch) -> None:
    """Files taken as unchanged during the walk that were not (the digests differ) are read
    after it, each reached by its path again: a folder on the way that became a symlink
    since fails the listing instead of leading to the link's target."""
    records = _records(site)
    (site / "pkg/sub/deep.py").write_text("deep = 2\n")  # a change: the keys get decoded
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "deep.py").write_text("secret = 1\n")

    def swap():
        os.rename(site / "pkg/sub", tmp_path / "moved")
        os.symlink(outside, site / "pkg/sub")

    _between_walk_and_reads(monkeypatch, swap)
    with pytest.raises(wire.AgentError) as failed:
        _list(site, _frame(records), records_digest(records), _cache_time())
    assert "symlink" in str(failed.value) and "changed while listed" in str(failed.value)


def test_a_file_removed_before_it_is_read_is_gone_not_listed(site: Path, monkeypatch) -> None:
    records = _records(site)
    (site / "pkg/m1.py").write_text("value = 11\n")
    _between_walk_and_reads(monkeypatch, (site / "pkg/m1.py").unlink)
    reply, channel = _list_on(site, _frame(records), records_digest(records), _cache_time())
    assert (reply["entries"], reply["gone"], reply["same"]) == ([], ["pkg/m1.py"], len(FILES) - 1)
    assert "pkg/m1.py" not in channel.listed and len(channel.listed) == len(FILES) - 1


def test_a_file_swapped_for_a_folder_before_it_is_read_fails_the_listing(site: Path, monkeypatch) -> None:
    records = _records(site)
    (site / "pkg/m2.py").write_text("value = 22\n")

    def swap():
        (site / "pkg/m2.py").unlink()
        (site / "pkg/m2.py").mkdir()
        (site / "pkg/m2.py/inner.py").write_text("inner = 1\n")

    _between_walk_and_reads(monkeypatch, swap)
    with pytest.raises(wire.AgentError) as failed:
        _list(site, _frame(records), records_digest(records), _cache_time())
    assert "pkg/m2.py: changed while listed" in str(failed.value)
