"""Plain values: path quoting (checked against git's own), manifests, safe paths, entries."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from snapver.model import Entry, Manifest, is_safe_relpath, quote_path, unquote_path

# Names whose bytes git must keep exactly: controls, quotes, backslash, non-UTF-8, unicode.
ODD_NAMES = [
    b"plain.py", b"sp ace.py", b'quo"te.py', b"apo'strophe.py", b"back\\slash.py",
    b"new\nline.py", b"tab\there.py", b"bell\x07.py", b"del\x7f.py", b"cr\r.py",
    b"caf\xe9.py", b"\xff\xfe.bin", "ünïcödé.py".encode(), "日本.py".encode(), b'"leading-quote.py',
    b" lead-space.py", b"-dash.py",
]

# Paths are what os.fsdecode makes of a name's bytes: undecodable bytes become surrogate escapes.
path_bytes = st.binary(min_size=1).filter(lambda raw: b"\0" not in raw) | st.text(min_size=1).filter(
    lambda text: "\0" not in text).map(lambda text: text.encode("utf-8", "surrogatepass"))


@given(path_bytes)
def test_quote_round_trips(raw: bytes) -> None:
    path = os.fsdecode(raw)
    quoted = quote_path(path)
    assert unquote_path(quoted) == path
    assert "\n" not in quoted and "\t" not in quoted


def test_quote_path_is_what_git_prints(tmp_path: Path) -> None:
    """git's quoted names unquote to the exact bytes, and UTF-8 names are quoted as git quotes them."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ODD_NAMES:
        with open(os.path.join(os.fsencode(repo), name), "wb") as handle:
            handle.write(name)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "add", "-A"], check=True)
    for quote_setting, readable in (("false", True), ("true", False)):
        out = subprocess.run(["git", "-C", str(repo), "-c", f"core.quotePath={quote_setting}", "ls-files"],
                             capture_output=True, check=True).stdout
        printed = out.decode("utf-8", "surrogateescape").splitlines()
        names = sorted(os.fsdecode(name) for name in ODD_NAMES)
        assert sorted(unquote_path(line) for line in printed) == names
        if readable:  # git prints undecodable bytes raw here; snapver's octal escapes are its own choice
            utf8 = [os.fsdecode(name) for name in ODD_NAMES if _is_utf8(name)]
            assert sorted(set(printed) & {quote_path(name) for name in utf8}) == sorted(map(quote_path, utf8))


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_quote_leaves_ordinary_names_alone() -> None:
    assert quote_path("sglang/srt/sp ace/ü.py") == "sglang/srt/sp ace/ü.py"
    assert quote_path('a"b') == '"a\\"b"'
    assert quote_path("caf" + os.fsdecode(b"\xe9")) == '"caf\\351"'
    assert unquote_path('"a\\nb\\\\c\\303\\274"') == "a\nb\\cü"


def _entry(path: str, kind: str = "f", mode: int = 0o100644, size: int = 1, digest: str = "d" * 64) -> Entry:
    return Entry(path, kind, mode, size, digest, "0" * 40)


def test_manifest_round_trips_odd_names_and_sorts_by_bytes() -> None:
    names = [os.fsdecode(b"sglang/srt/" + name) for name in ODD_NAMES] + [
        "sglang/srt/a/b.py", "sglang/srt/a.b", "sglang/srt/a-b", "sglang/srt/A"]
    entries = [_entry(name, size=i, mode=0o100755 if i % 2 else 0o100644) for i, name in enumerate(names)]
    entries.append(_entry("sglang/srt/link", kind="l", mode=0o120777, size=7))
    manifest = Manifest.of(entries)
    text = manifest.serialize()
    assert text.count(b"\n") == len(entries)
    parsed = Manifest.parse(text)
    assert parsed.entries == manifest.entries
    order = [entry.path for entry in parsed]
    assert order == sorted(order, key=os.fsencode)
    assert parsed.total_size() == sum(e.size for e in entries)
    assert len(parsed) == len(entries) and "sglang/srt/link" in parsed


def test_manifest_line_format() -> None:
    line = Manifest.of([_entry("sglang/srt/x y.py", mode=0o100600, size=3, digest="ab" * 32)]).serialize()
    assert line == b"f 100600 3 " + b"ab" * 32 + b" " + b"0" * 40 + b"\tsglang/srt/x y.py\n"


def test_entry_git_mode_and_same_content() -> None:
    assert _entry("a", mode=0o100644).git_mode == "100644"
    assert _entry("a", mode=0o100600).git_mode == "100644"
    assert _entry("a", mode=0o100755).git_mode == "100755"
    assert _entry("a", mode=0o100744).git_mode == "100755"
    assert _entry("a", kind="l", mode=0o120777).git_mode == "120000"
    assert _entry("a").same_content(_entry("a", size=2))
    assert not _entry("a").same_content(_entry("a", mode=0o100755))
    assert not _entry("a").same_content(_entry("a", digest="e" * 64))
    assert not _entry("a").same_content(_entry("a", kind="l"))


@pytest.mark.parametrize("path", ["sglang/srt/x.py", "a", "a/b c/d", "sglang/srt/..x", "x/.hidden", "...", "a/b..",
                                  "a/.x/b", "a\nb/c"])
def test_safe_relpaths(path: str) -> None:
    assert is_safe_relpath(path)


@pytest.mark.parametrize("path", ["", "/etc/passwd", "../x", "a/../../b", "a/./b", "a//b", "a/", "a\0b", "..", ".",
                                  "./a", "a/.", "a/..", "/", "//"])
def test_unsafe_relpaths(path: str) -> None:
    assert not is_safe_relpath(path)
