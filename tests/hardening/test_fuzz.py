"""Fuzzing the two parsers that read what users and other tools type: refs and diff files.

Whatever the input, the only exceptions allowed out are SnapverError subclasses (which
the CLI turns into one line and the right exit code). Inputs are built from the
grammar's own pieces so that the fuzzer reaches deep into both parsers.
"""

from __future__ import annotations

import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from snapver.config import Config, NodeSpec
from snapver.errors import SnapverError
from snapver.model import Entry, Manifest
from snapver.ops.patch.diffs import changes_from_diff
from snapver.ops.patch.model import Base
from snapver.refs import Resolver, parse_day
from snapver.store.objects import blob_oid
from snapver.store.records import format_message
from snapver.store.repo import Store
from snapver.unidiff import apply_hunks, parse_diff

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])

# --------------------------------------------------------------------------- refs

REF_PIECES = st.sampled_from([
    "ct200", "ct129", "v1", "p1", "ghost", "@", "@@", "@live", "@latest", "@LIVE", "~", "~1", "~0", "~99999999999",
    "~-1", "@2026-05-22", "@9999-12-31", "@0001-01-01", "@0001-01-01T00:00", "@9999-12-31T23:59:59+14:00",
    "@may22", "@feb29", "@may-32", "@2026-13-01", "@2026-02-30", "2026-05-22", "may22", "May 22", "tags/",
    "patches/", "refs/", "refs/heads/nodes/", "..", "/", "-", "--", "-x", " ", "\t", "\n", "\x00", "\x7f", "^",
    ":", "?", "*", "[", "\\", "{", "}", "@{1}", "HEAD", "0123456", "abcdef0123456789", "f" * 40, "0" * 41, "é",
    "\udcff", "$(touch pwned)", ";", "'", '"',
])
REF_TEXT = st.one_of(st.lists(REF_PIECES, max_size=5).map("".join), st.text(max_size=30))


@pytest.fixture(scope="module")
def ref_world(tmp_path_factory: pytest.TempPathFactory) -> tuple[Store, Config]:
    """A store with snapshots of ct200 (two) and ct129, a tag v1 and a patch p1, made with git."""
    path = tmp_path_factory.mktemp("fuzz-refs") / "store"
    store = Store.create(path)
    manifest = Manifest.of([Entry("sglang/srt/a.py", "f", 0o100644, 2, "0" * 64, blob_oid(b"a\n"))])
    now = datetime.now(timezone.utc)
    with store.importer() as importer:
        importer.add_blob(b"a\n")
        marks = [importer.commit("refs/heads/nodes/ct200", None, manifest,
                                 format_message("one", {"kind": "snapshot", "node": "ct200"}), now - timedelta(days=3))]
    first = importer.results[marks[0]]
    with store.importer() as importer:
        marks = [importer.commit("refs/heads/nodes/ct200", first, manifest,
                                 format_message("two", {"kind": "snapshot", "node": "ct200"}), now),
                 importer.commit("refs/heads/nodes/ct129", None, manifest,
                                 format_message("three", {"kind": "snapshot", "node": "ct129"}), now),
                 importer.commit("refs/heads/patches/p1", first, manifest,
                                 format_message("patch", {"kind": "patch", "name": "p1", "base": first}), now)]
    store.update_ref("refs/tags/v1", first)
    nodes = {name: NodeSpec(name=name, site_packages="/nonexistent") for name in ("ct200", "ct129", "gpu-a")}
    return store, Config(path=None, store_path=path, nodes=nodes)


@SETTINGS
@given(text=REF_TEXT)
def test_ref_parser_raises_only_snapver_errors(ref_world, text: str) -> None:
    store, config = ref_world
    for resolve in (lambda: Resolver(store, config).snapshot(text), lambda: Resolver(store, config).tree(text),
                    lambda: Resolver(None, config).tree(text), lambda: parse_day(text)):
        try:
            resolve()
        except SnapverError:
            pass


@pytest.mark.parametrize("text", ["ct200@9999-12-31", "ct200@0001-01-01T00:00", "ct200@9999-12-31T23:59:59+14:00",
                                  "ct200@0001-01-01T00:00:00-14:00"])
def test_dates_at_the_ends_of_time(ref_world, text: str) -> None:
    """The last day there is names the newest snapshot; the first names none (exit 2)."""
    store, config = ref_world
    newest = store.ref("refs/heads/nodes/ct200")
    try:
        assert Resolver(store, config).snapshot(text) == newest
    except SnapverError as exc:
        assert exc.exit_code == 2 and "0001" in text


# --------------------------------------------------------------------------- diff files

BASE_FILES = {"sglang/srt/a.py": b"one\ntwo\nthree\nfour\n", "sglang/srt/b.py": b"x = 1\n",
              "sglang/srt/bin.dat": b"\0\1\2"}
LINES = st.sampled_from([
    "diff --git a/sglang/srt/a.py b/sglang/srt/a.py", "diff --git a/x b/y", 'diff --git "a/sp ace" "b/sp ace"',
    "diff --git a/sglang/srt/link b/sglang/srt/link", "diff --git ", "diff --git a", '"',
    "--- a/sglang/srt/a.py", "+++ b/sglang/srt/a.py", "--- /dev/null", "+++ /dev/null", "--- ", "+++ ",
    "--- a/../../etc/passwd", "+++ /etc/passwd", '+++ "b/\\777"', '+++ "b/\\x"', '+++ "b/\\', '--- "a/\\19"',
    "--- a/sglang/srt/a.py\t1970-01-01 00:00:00.000000000 +0000", "+++ b/x\t2026-99-99 99:99:99 +9999",
    "@@ -1,4 +1,4 @@", "@@ -0,0 +1 @@", "@@ -1 +0,0 @@", "@@ -2,3 +2,3 @@", "@@ -99999999999999,1 +1 @@",
    "@@ -1,99999999 +1,99999999 @@", "@@ -0,1 +0,1 @@", "@@ garbage", "@@ -1,-1 +1 @@",
    " one", " two", "-two", "+TWO", "-three", "+", "-", " ", "", "\\ No newline at end of file", "\\",
    "old mode 100644", "new mode 100755", "old mode xyz", "new mode 9", "new file mode 120000",
    "new file mode", "deleted file mode 100644", "deleted file mode zzz", "similarity index 90%",
    "rename from sglang/srt/a.py", "rename to sglang/srt/c.py", "rename to ../../etc/cron.d/x", "copy from /etc",
    "copy to sglang/srt/d.py", "index 0000000..1111111 100644", "index 12345..abcdef", "index zz..yy",
    "GIT binary patch", "literal 3", "literal 99999999999", "literal 99999999999999999999999", "literal -5",
    "literal x", "literal", "delta 3", "zcmV-", "zcmZQzVP|",
    "Binary files a/x and b/x differ", "Only in x: y", "Subject: [PATCH] fix", "From abc Mon Sep 17", "-- ",
    "Ω", "\udcff", "\r", "two\r",
])
DIFF_TEXT = st.one_of(
    st.lists(LINES, max_size=25).map(lambda lines: "\n".join(lines).encode("utf-8", "surrogateescape")),
    st.lists(LINES, max_size=25).map(lambda lines: ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")),
    st.binary(max_size=200),
)


@pytest.fixture(scope="module")
def diff_base() -> Base:
    entries = [Entry(path, "f", 0o100644, len(data), "0" * 64, blob_oid(data)) for path, data in BASE_FILES.items()]
    entries.append(Entry("sglang/srt/link", "l", 0o120777, 4, "0" * 64, blob_oid(b"a.py")))
    return Base("0" * 40, Manifest.of(entries), "ct200", ("sglang/srt",), [])


def read_base_blob(oid: str) -> bytes:
    for data in [*BASE_FILES.values(), b"a.py"]:
        if blob_oid(data) == oid:
            return data
    raise AssertionError(f"unknown blob {oid}")


@SETTINGS
@given(data=DIFF_TEXT)
def test_diff_parser_raises_only_snapver_errors(data: bytes) -> None:
    try:
        parsed = parse_diff(data, "fuzz.diff")
    except SnapverError:
        return
    for diff in parsed.files:
        try:
            apply_hunks("x", b"one\ntwo\nthree\nfour\n", diff.hunks)
        except SnapverError:
            pass


@SETTINGS
@given(data=DIFF_TEXT)
def test_patch_import_raises_only_snapver_errors_and_stays_inside(diff_base: Base, data: bytes) -> None:
    try:
        changes, _ = changes_from_diff(data, diff_base, "fuzz.diff", read_blob=read_base_blob)
    except SnapverError:
        return
    for path in changes:
        assert path.startswith("sglang/srt/") and ".." not in path.split("/"), path


def test_git_made_diffs_still_import(diff_base: Base, tmp_path: Path) -> None:
    """The fuzz targets are the real parser: a diff git itself made imports exactly."""
    for path, data in BASE_FILES.items():
        (tmp_path / "a" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "a" / path).write_bytes(data)
    subprocess.run(["cp", "-a", str(tmp_path / "a"), str(tmp_path / "b")], check=True)
    (tmp_path / "b" / "sglang/srt/a.py").write_bytes(b"one\nTWO\nthree\nfour\n")
    made = subprocess.run(["git", "diff", "--no-index", "a", "b"], cwd=tmp_path, capture_output=True).stdout
    changes, _ = changes_from_diff(made, diff_base, "git.diff", read_blob=read_base_blob)
    (entry, content), = changes.values()
    assert entry.path == "sglang/srt/a.py" and content == b"one\nTWO\nthree\nfour\n"
