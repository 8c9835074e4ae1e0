"""Unified diffs in: parse `diff -u`, `git diff` and `git format-patch` output; apply hunks exactly.

Everything is bytes: file content and diff lines keep their exact line endings, and
names that are not UTF-8 survive (decoded with ``surrogateescape`` as everywhere else).
A hunk applies only where its header says and only if every context and removed line
matches the original byte for byte; a diff made against other content is refused with
the file, the hunk and the first line that differs.
"""

from __future__ import annotations

import base64
import re
import zlib
from dataclasses import dataclass, field

from snapver.errors import ConflictError, PatchError
from snapver.model import unquote_path

_HUNK = re.compile(rb"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_INDEX = re.compile(rb"^index ([0-9a-f]+)\.\.([0-9a-f]+)(?: ([0-7]+))?\s*$")
_GIT_HEADERS = (b"old mode ", b"new mode ", b"deleted file mode ", b"new file mode ", b"copy from ",
                b"copy to ", b"rename from ", b"rename to ", b"similarity index ", b"dissimilarity index ",
                b"index ")


@dataclass
class Hunk:
    """One ``@@`` block: ``lines`` are (' ', '-' or '+', line bytes with their ending)."""

    header: str
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: list[tuple[str, bytes]] = field(default_factory=list)

    @property
    def old_lines(self) -> list[bytes]:
        return [text for tag, text in self.lines if tag != "+"]

    @property
    def new_lines(self) -> list[bytes]:
        return [text for tag, text in self.lines if tag != "-"]


@dataclass
class FileDiff:
    """The change to one file. Paths are as written in the diff (prefixes not stripped);
    None stands for ``/dev/null``. Modes and blob ids come from git's extended headers."""

    old_path: str | None
    new_path: str | None
    line: int
    git: bool = False
    old_mode: int | None = None
    new_mode: int | None = None
    old_oid: str | None = None
    new_oid: str | None = None
    rename: bool = False
    copy: bool = False
    hunks: list[Hunk] = field(default_factory=list)
    binary: bytes | None = None  # a `GIT binary patch` literal: the new content
    binary_delta: bytes | None = None  # a `GIT binary patch` delta: instructions against the old blob

    @property
    def deleted(self) -> bool:
        return self.new_path is None

    @property
    def created(self) -> bool:
        return self.old_path is None


@dataclass
class ParsedDiff:
    files: list[FileDiff]
    subject: str = ""


def split_lines(data: bytes) -> list[bytes]:
    """Lines with their endings; only ``\\n`` ends a line (a ``\\r`` stays part of it)."""
    lines = data.split(b"\n")
    tail = lines.pop()
    result = [line + b"\n" for line in lines]
    if tail:
        result.append(tail)
    return result


def parse_diff(data: bytes, source: str = "the diff") -> ParsedDiff:
    """Parse every file section of a unified diff; anything between sections is ignored
    (mail headers, commit messages, diffstats), except what says content is missing."""
    lines = split_lines(data)
    files: list[FileDiff] = []
    subject = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        try:
            section = _parse_section(lines, i, source)
        except ValueError as exc:  # a bad number, mode or quoted name in a header line
            raise PatchError(f"{source}, near line {i + 1}: malformed diff: {exc}") from None
        if section is not None:
            diff, i = section
            files.append(diff)
        elif line.startswith(b"Only in "):
            raise PatchError(f"{source}, line {i + 1}: {_show(line)}: the diff lacks that file's content",
                             hint="make the diff with `diff -ruN` (or `git diff`) so new files are included")
        elif line.startswith(b"Binary files ") and line.rstrip().endswith(b" differ"):
            raise PatchError(f"{source}, line {i + 1}: {_show(line)}: binary content is not in the diff",
                             hint="make it with `git diff --binary`")
        elif line.startswith(b"Subject: ") and not files and not subject:
            subject = re.sub(r"^(\[[^]]*\]\s*)+", "", line[9:].decode("utf-8", "replace").strip())
            i += 1
        else:
            i += 1
    if not files:
        raise PatchError(f"{source} holds no unified diff", hint="expected output of `diff -u`, `git diff` "
                         "or `git format-patch`")
    return ParsedDiff(files, subject)


def _parse_section(lines: list[bytes], i: int, source: str) -> tuple[FileDiff, int] | None:
    """The file section starting at line ``i`` and the line after it, or None if none starts there."""
    line = lines[i]
    if line.startswith(b"diff --git "):
        return _parse_git_section(lines, i, source)
    if line.startswith(b"--- ") and i + 1 < len(lines) and lines[i + 1].startswith(b"+++ "):
        diff = FileDiff(_header_path(lines[i][4:]), _header_path(lines[i + 1][4:]), i + 1)
        old_absent, new_absent = _epoch(lines[i]), _epoch(lines[i + 1])
        i = _parse_hunks(lines, i + 2, diff, source)
        # `diff -N` shows a missing side as an empty file dated at the epoch.
        if old_absent and all(h.old_count == 0 for h in diff.hunks):
            diff.old_path = None
        elif new_absent and all(h.new_count == 0 for h in diff.hunks):
            diff.new_path = None
        return diff, i
    return None


def _show(line: bytes) -> str:
    return line.rstrip(b"\r\n").decode("utf-8", "replace")


_STAMP = re.compile(rb"\t(\d{4})-(\d\d)-(\d\d) (\d\d):(\d\d):(\d\d)(?:\.\d+)?(?: ([+-])(\d\d)(\d\d))?\s*$")


def _epoch(line: bytes) -> bool:
    """True when a ---/+++ line's timestamp is the Unix epoch (how `diff -N` marks absence)."""
    match = _STAMP.search(line)
    if match is None:
        return False
    from datetime import datetime, timedelta, timezone

    year, month, day, hour, minute, second = (int(match[n]) for n in range(1, 7))
    try:
        moment = datetime(year, month, day, hour, minute, second, tzinfo=timezone.utc)
    except ValueError:
        return False
    if match[7]:
        offset = timedelta(hours=int(match[8]), minutes=int(match[9]))
        moment -= offset if match[7] == b"+" else -offset
    return moment.timestamp() == 0


def _header_path(raw: bytes) -> str | None:
    """The name on a ``---``/``+++`` line: C-quoted, or up to a tab (timestamps follow one)."""
    raw = raw.rstrip(b"\n").rstrip(b"\r")
    if raw.startswith(b'"'):
        name, _ = _quoted(raw)
    else:
        name = raw.split(b"\t", 1)[0].decode("utf-8", "surrogateescape")
    return None if name == "/dev/null" else name


def _quoted(raw: bytes) -> tuple[str, bytes]:
    """A C-quoted name at the start of ``raw`` and what follows it."""
    end = 1
    while end < len(raw):
        if raw[end:end + 1] == b"\\":
            end += 2
            continue
        if raw[end:end + 1] == b'"':
            break
        end += 1
    return unquote_path(raw[:end + 1].decode("utf-8", "surrogateescape")), raw[end + 1:]


def _git_names(raw: bytes) -> tuple[str | None, str | None]:
    """Both names of a ``diff --git A B`` line (used when no ---/+++ lines follow)."""
    raw = raw.rstrip(b"\n").rstrip(b"\r")
    if raw.startswith(b'"'):
        first, rest = _quoted(raw)
        rest = rest.lstrip(b" ")
        second = _quoted(rest)[0] if rest.startswith(b'"') else rest.decode("utf-8", "surrogateescape")
        return first, second
    text = raw.decode("utf-8", "surrogateescape")
    if text.endswith('"'):
        start = text.rfind(' "')
        return text[:start], _quoted(text[start + 1:].encode("utf-8", "surrogateescape"))[0]
    if text.count(" ") == 1:
        first, second = text.split(" ")
        return first, second
    # Unquoted and equal after their prefixes (no rename): split in the middle.
    half = len(text) // 2
    if len(text) % 2 == 1 and text[half] == " ":
        first, second = text[:half], text[half + 1:]
        if first.partition("/")[2] == second.partition("/")[2]:
            return first, second
    return None, None


def _parse_git_section(lines: list[bytes], i: int, source: str) -> tuple[FileDiff, int]:
    start = i
    git_line = lines[i][len(b"diff --git "):]
    old_name, new_name = _git_names(git_line)
    diff = FileDiff(old_name, new_name, i + 1, git=True)
    created = deleted = False
    moved: dict[str, str | None] = {}
    index_mode: int | None = None
    i += 1
    while i < len(lines) and lines[i].startswith(_GIT_HEADERS):
        line = lines[i].rstrip(b"\r\n")
        if line.startswith(b"old mode "):
            diff.old_mode = int(line[9:], 8)
        elif line.startswith(b"new mode "):
            diff.new_mode = int(line[9:], 8)
        elif line.startswith(b"deleted file mode "):
            diff.old_mode = int(line[18:], 8)
            deleted = True
        elif line.startswith(b"new file mode "):
            diff.new_mode = int(line[14:], 8)
            created = True
        elif line.startswith((b"rename from ", b"copy from ")):
            diff.rename = line.startswith(b"rename")
            diff.copy = not diff.rename
            moved["from"] = _header_path(line.split(b" from ", 1)[1])
        elif line.startswith((b"rename to ", b"copy to ")):
            moved["to"] = _header_path(line.split(b" to ", 1)[1])
        elif (match := _INDEX.match(line)) is not None:
            diff.old_oid, diff.new_oid = match[1].decode(), match[2].decode()
            index_mode = int(match[3], 8) if match[3] else None
        i += 1
    if index_mode is not None and diff.old_mode is None and diff.new_mode is None:
        # A mode that does not change is only on the index line (a symlink's 120000 too).
        diff.old_mode = diff.new_mode = index_mode
    if moved and (diff.old_path is None or diff.new_path is None):
        # The names of a pure rename, given without the a/ b/ prefixes of the git line.
        prefixes = ("a/", "b/") if git_line.startswith((b"a/", b'"a/')) else ("", "")
        old, new = moved.get("from"), moved.get("to")
        diff.old_path = prefixes[0] + old if old else None
        diff.new_path = prefixes[1] + new if new else None
    if i + 1 < len(lines) and lines[i].startswith(b"--- ") and lines[i + 1].startswith(b"+++ "):
        diff.old_path = _header_path(lines[i][4:]) or diff.old_path
        diff.new_path = _header_path(lines[i + 1][4:]) or diff.new_path
        hunks_at = i + 2
    else:
        hunks_at = None
    if created:
        diff.old_path = None
    if deleted:
        diff.new_path = None
    if (diff.old_path or diff.new_path) is None:
        raise PatchError(f"{source}, line {start + 1}: cannot read the file names of {_show(lines[start])!r}")
    if hunks_at is not None:
        return diff, _parse_hunks(lines, hunks_at, diff, source)
    if i < len(lines) and lines[i].startswith(b"GIT binary patch"):
        return diff, _parse_binary(lines, i + 1, diff, source)
    if i < len(lines) and lines[i].startswith(b"Binary files "):
        raise PatchError(f"{source}, line {i + 1}: {_show(lines[i])}: binary content is not in the diff",
                         hint="make it with `git diff --binary`")
    return diff, i


def _parse_hunks(lines: list[bytes], i: int, diff: FileDiff, source: str) -> int:
    name = diff.new_path or diff.old_path
    if i >= len(lines) or not lines[i].startswith(b"@@"):
        raise PatchError(f"{source}, line {i + 1}: {name}: expected a hunk (@@ -a,b +c,d @@) after the file names")
    while i < len(lines) and lines[i].startswith(b"@@"):
        match = _HUNK.match(lines[i])
        if match is None:
            raise PatchError(f"{source}, line {i + 1}: {name}: malformed hunk header {_show(lines[i])!r}")
        hunk = Hunk(_show(lines[i]), int(match[1]), int(match[2] or b"1"), int(match[3]),
                    int(match[4] or b"1"))
        number = len(diff.hunks) + 1
        i += 1
        old_seen = new_seen = 0
        while old_seen < hunk.old_count or new_seen < hunk.new_count:
            if i >= len(lines):
                raise PatchError(f"{source}: {name}: hunk {number} ({hunk.header}) ends early: "
                                 f"{hunk.old_count - old_seen} old and {hunk.new_count - new_seen} new lines missing")
            line = lines[i]
            tag = line[:1]
            if line in (b"\n", b"\r\n"):  # a blank context line whose space a mailer dropped
                tag, line = b" ", b" " + line
            if tag == b" ":
                hunk.lines.append((" ", line[1:]))
                old_seen += 1
                new_seen += 1
            elif tag == b"-":
                hunk.lines.append(("-", line[1:]))
                old_seen += 1
            elif tag == b"+":
                hunk.lines.append(("+", line[1:]))
                new_seen += 1
            elif tag == b"\\" and hunk.lines:
                _drop_newline(hunk)
            else:
                raise PatchError(f"{source}, line {i + 1}: {name}: hunk {number} ({hunk.header}): "
                                 f"unexpected line {_show(line)[:60]!r}")
            if old_seen > hunk.old_count or new_seen > hunk.new_count:
                raise PatchError(f"{source}, line {i + 1}: {name}: hunk {number} ({hunk.header}) has more lines "
                                 "than its header says")
            i += 1
        if i < len(lines) and lines[i].startswith(b"\\"):
            _drop_newline(hunk)
            i += 1
        diff.hunks.append(hunk)
    return i


def _drop_newline(hunk: Hunk) -> None:
    """``\\ No newline at end of file``: the line before it has no line ending."""
    tag, text = hunk.lines[-1]
    if text.endswith(b"\n"):
        text = text[:-1]
    hunk.lines[-1] = (tag, text)


def _parse_binary(lines: list[bytes], i: int, diff: FileDiff, source: str) -> int:
    """A ``GIT binary patch``: the forward block is decoded — a ``literal`` (the new content)
    or a ``delta`` (git's copy/insert instructions against the old blob, see ``apply_delta``)."""
    if i >= len(lines) or not lines[i].startswith((b"literal ", b"delta ")):
        raise PatchError(f"{source}, line {i + 1}: {diff.new_path or diff.old_path}: malformed binary patch")
    name = diff.new_path or diff.old_path
    is_delta = lines[i].startswith(b"delta ")
    try:
        size = int(lines[i].split()[1])
    except (IndexError, ValueError):
        raise PatchError(f"{source}, line {i + 1}: {name}: malformed binary patch") from None
    if not 0 <= size < 1 << 40:
        raise PatchError(f"{source}, line {i + 1}: {name}: impossible binary size {size}")
    i += 1
    encoded = bytearray()
    while i < len(lines) and lines[i].strip():
        line = lines[i].rstrip(b"\r\n")
        length = line[0] - 64 if line[:1].isupper() else line[0] - 96 + 26
        try:
            encoded += base64.b85decode(line[1:])[:length]
        except ValueError as exc:
            raise PatchError(f"{source}, line {i + 1}: {name}: corrupt binary patch: {exc}") from exc
        i += 1
    inflater = zlib.decompressobj()
    try:
        # Never inflate past the size the patch states: a small literal can expand a thousandfold.
        inflated = inflater.decompress(bytes(encoded), size + 1)
    except zlib.error as exc:
        raise PatchError(f"{source}: {name}: corrupt binary patch: {exc}") from exc
    if len(inflated) != size:
        raise PatchError(f"{source}: {name}: binary patch size {len(inflated)} is not the {size} it states")
    if is_delta:
        diff.binary_delta = inflated
    else:
        diff.binary = inflated
    # Skip the reverse block (if any) up to the next section.
    while i < len(lines) and not lines[i].startswith((b"diff --git ", b"--- ")):
        i += 1
    return i


def _varint(delta: bytes, at: int, path: str) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(delta):
            raise PatchError(f"{path}: corrupt binary delta (it ends inside its header)")
        byte = delta[at]
        at += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, at


def check_delta_base(path: str, claimed: str | None, actual: str, base: str, source: str) -> None:
    """A binary delta applies only to the blob its ``index`` line names: another one is a
    ConflictError naming the file (an all-zero or absent id checks nothing)."""
    if claimed and set(claimed) != {"0"} and not actual.startswith(claimed):
        raise ConflictError(f"{source}: {path}: conflict: the binary delta was made against blob {claimed}, "
                            f"but {base} holds {actual[:len(claimed)]}",
                            hint="is --base the snapshot the diff was made against?")


def apply_delta(path: str, original: bytes, delta: bytes) -> bytes:
    """Apply a git binary delta (the pack format: source size, result size, then copy and
    insert instructions) to ``original``. A source of another size is a ConflictError
    naming the file; a malformed delta a PatchError."""
    source_size, at = _varint(delta, 0, path)
    result_size, at = _varint(delta, at, path)
    if source_size != len(original):
        raise ConflictError(f"{path}: conflict: the binary delta was made against a {source_size}-byte file, "
                            f"the base holds {len(original)} bytes",
                            hint="is --base the snapshot the diff was made against?")
    out = bytearray()
    while at < len(delta):
        command = delta[at]
        at += 1
        if command & 0x80:  # copy: offset and size from the bytes its bits announce
            offset = size = 0
            for bit in range(4):
                if command & (1 << bit):
                    if at >= len(delta):
                        raise PatchError(f"{path}: corrupt binary delta (a copy is cut short)")
                    offset |= delta[at] << (8 * bit)
                    at += 1
            for bit in range(3):
                if command & (0x10 << bit):
                    if at >= len(delta):
                        raise PatchError(f"{path}: corrupt binary delta (a copy is cut short)")
                    size |= delta[at] << (8 * bit)
                    at += 1
            size = size or 0x10000
            if offset + size > len(original) or len(out) + size > result_size:
                raise PatchError(f"{path}: corrupt binary delta (a copy reaches past its source or result)")
            out += original[offset:offset + size]
        elif command:  # insert the next `command` bytes
            if at + command > len(delta) or len(out) + command > result_size:
                raise PatchError(f"{path}: corrupt binary delta (an insert is cut short or too long)")
            out += delta[at:at + command]
            at += command
        else:
            raise PatchError(f"{path}: corrupt binary delta (instruction 0 is reserved)")
    if len(out) != result_size:
        raise PatchError(f"{path}: corrupt binary delta: it makes {len(out)} bytes, not the {result_size} it states")
    return bytes(out)


def apply_hunks(path: str, original: bytes, hunks: list[Hunk]) -> bytes:
    """Apply ``hunks`` to ``original`` exactly where they say; PatchError names the
    file, the hunk and the first line that differs."""
    lines = split_lines(original)
    out: list[bytes] = []
    cursor = 0
    for number, hunk in enumerate(hunks, 1):
        old = hunk.old_lines
        start = hunk.old_start - 1 if hunk.old_count else hunk.old_start
        if start < cursor or lines[start:start + len(old)] != old:
            difference, endings = _first_difference(lines, start, old)
            raise PatchError(f"{path}: hunk {number} ({hunk.header}) does not apply: {difference}",
                             hint=_elsewhere(lines, old)
                             or (("were the diff's line endings converted (an editor, a mailer)? "
                                  "make it again, or convert them back") if endings else
                                 "the diff was made against other content than --base holds"))
        out += lines[cursor:start]
        out += hunk.new_lines
        cursor = start + len(old)
    out += lines[cursor:]
    return b"".join(out)


def _first_difference(lines: list[bytes], start: int, old: list[bytes]) -> tuple[str, bool]:
    """Where the hunk's old lines first differ from the file, and whether only by line ending."""
    for offset, expected in enumerate(old):
        number = start + offset
        actual = lines[number] if 0 <= number < len(lines) else None
        if actual is not None and actual != expected and _show(actual) == _show(expected):
            # Shown without their endings the two would look equal.
            endings = f"{_ending(expected)} in the diff, {_ending(actual)} in the file"
            return f"line {number + 1}: the line endings differ ({endings})", True
        if actual != expected:
            found = "the end of the file" if actual is None else repr(_show(actual))
            return f"line {number + 1}: expected {_show(expected)!r}, found {found}", False
    return f"it overlaps the hunk before it (line {start + 1})", False


def _ending(line: bytes) -> str:
    return "CRLF" if line.endswith(b"\r\n") else "LF" if line.endswith(b"\n") else \
        "CR" if line.endswith(b"\r") else "none"


def _elsewhere(lines: list[bytes], old: list[bytes]) -> str:
    if not old:
        return ""
    for start in range(len(lines) - len(old) + 1):
        if lines[start:start + len(old)] == old:
            return (f"that hunk's lines are at line {start + 1} instead: the diff was made against "
                    "another version than --base")
    return ""
