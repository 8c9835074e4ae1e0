"""Plain values shared by every layer: entries, manifests, node facts, changes.

Paths are ``str`` relative to site-packages, decoded with ``surrogateescape`` so that
names that are not UTF-8 survive byte for byte (``os.fsencode`` gives the bytes back).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import NamedTuple

FILE = "f"
LINK = "l"
# A FIFO, socket or device: never opened; recorded as the one line that says what it is
# (see the agent's special_text), so that diff and status show it and rollback replaces it.
SPECIAL = "s"

MANIFEST_PATH = ".snapver/manifest"
# The id git gives "no object": a ref expected not to exist yet, or a diff's absent side.
ZERO_OID = "0" * 40

# Longest tag or patch name: a ref is a file (and its `.lock` sibling), so the name must fit
# one path component (255 bytes) with room to spare; nobody types more.
MAX_NAME_LENGTH = 100


@dataclass(frozen=True)
class Entry:
    """One tracked path as recorded in a snapshot.

    ``mode`` is the full ``st_mode`` (type and permission bits); ``digest`` the blake3
    of the content (of the link target for a symlink); ``oid`` the git blob id.
    """

    path: str
    kind: str
    mode: int
    size: int
    digest: str
    oid: str

    @property
    def git_mode(self) -> str:
        """The mode git can keep for this entry in a tree."""
        if self.kind == LINK:
            return "120000"
        return "100755" if self.mode & 0o111 else "100644"

    def same_content(self, other: Entry) -> bool:
        """True when kind, content and mode all agree."""
        return (self.kind, self.digest, self.mode) == (other.kind, other.digest, other.mode)


class StatEntry(NamedTuple):
    """One path as a node lists it: what it is, its stat, and its git blob id.

    A named tuple, not a frozen dataclass: listings make thousands per node, and a frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``, several times
    slower."""

    path: str
    kind: str
    mode: int
    size: int
    mtime_ns: int
    ctime_ns: int
    ino: int
    oid: str
    target: str | None = None

    @property
    def stat_key(self) -> tuple[int, int, int, int, int]:
        """What must stay equal for the cached oid of this path to be trusted."""
        return (self.size, self.mtime_ns, self.ctime_ns, self.ino, self.mode)


@dataclass
class Manifest:
    """The blake3 manifest of a snapshot: every tracked path, sorted by path bytes."""

    entries: dict[str, Entry] = field(default_factory=dict)

    def __iter__(self) -> Iterator[Entry]:
        for path in sorted(self.entries, key=os.fsencode):
            yield self.entries[path]

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, path: object) -> bool:
        return path in self.entries

    def get(self, path: str) -> Entry | None:
        return self.entries.get(path)

    @classmethod
    def of(cls, entries: Iterable[Entry]) -> Manifest:
        return cls({entry.path: entry for entry in entries})

    def total_size(self) -> int:
        return sum(entry.size for entry in self.entries.values())

    def serialize(self) -> bytes:
        """Text form kept in the snapshot tree: one line a path, git-style quoting."""
        lines = [
            f"{e.kind} {e.mode:o} {e.size} {e.digest} {e.oid}\t{quote_path(e.path)}\n"
            for e in self
        ]
        return "".join(lines).encode("utf-8", "surrogateescape")

    @classmethod
    def parse(cls, data: bytes) -> Manifest:
        entries = {}
        for line in data.decode("utf-8", "surrogateescape").splitlines():
            if not line:
                continue
            head, _, quoted = line.partition("\t")
            kind, mode, size, digest, oid = head.split(" ")
            path = unquote_path(quoted)
            entries[path] = Entry(path, kind, int(mode, 8), int(size), digest, oid)
        return cls(entries)


# What `diff --name-status` prints: content changed, added, deleted, type or mode changed.
MODIFIED, ADDED, DELETED, TYPE_CHANGED = "M", "A", "D", "T"


@dataclass(frozen=True)
class Change:
    """One path that differs between two trees (``old`` → ``new``); None where it is absent."""

    path: str
    status: str
    old: Entry | None
    new: Entry | None


def change_status(old: Entry, new: Entry) -> str | None:
    """How two entries for one path differ: by kind, git blob id, then permission bits.

    Content is compared by blob id, never by size or time. Permission bits count only
    for files and only when both sides know them (a zero means unknown).
    """
    if old.kind != new.kind:
        return TYPE_CHANGED
    if old.oid != new.oid:
        return MODIFIED
    old_bits, new_bits = stat.S_IMODE(old.mode), stat.S_IMODE(new.mode)
    if old.kind == FILE and old_bits and new_bits and old_bits != new_bits:
        return TYPE_CHANGED
    return None


def compare_manifests(old: Manifest, new: Manifest) -> list[Change]:
    """Every path that differs between two trees, sorted by path bytes (as git sorts)."""
    changes = []
    for path in sorted(set(old.entries) | set(new.entries), key=os.fsencode):
        before, after = old.get(path), new.get(path)
        if before is None:
            changes.append(Change(path, ADDED, None, after))
        elif after is None:
            changes.append(Change(path, DELETED, before, None))
        elif (status := change_status(before, after)) is not None:
            changes.append(Change(path, status, before, after))
    return changes


_ESCAPES = {"\a": "a", "\b": "b", "\t": "t", "\n": "n", "\v": "v", "\f": "f", "\r": "r",
            '"': '"', "\\": "\\"}
_UNESCAPES = {value: key for key, value in _ESCAPES.items()}
_NEEDS_QUOTE = re.compile('[\\x00-\\x1f\\x7f"\\\\\\udc80-\\udcff]')


def quote_path(path: str) -> str:
    """Quote a path the way git and ``git fast-import`` read it (C style, when needed).

    Bytes that are not UTF-8 (surrogate-escaped) and control characters become octal
    escapes; valid non-ASCII text is kept readable.
    """
    if not _NEEDS_QUOTE.search(path) and not path.startswith('"'):
        return path
    out = ['"']
    for ch in path:
        code = ord(ch)
        if ch in _ESCAPES:
            out.append("\\" + _ESCAPES[ch])
        elif 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\{code - 0xDC00:03o}")
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\{code:03o}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


# Control characters but newline and tab: what would drive a terminal from inside a line.
_CONTROLS = re.compile("[\\x00-\\x08\\x0b-\\x1f\\x7f]")


def quote_controls(text: str) -> str:
    """``text`` with each control character but newline and tab written as :func:`quote_path`
    writes it (ESC as ``\\033``): for text that is not one name (a message, an error line)."""
    return _CONTROLS.sub(lambda found: quote_path(found.group())[1:-1], text)


def unquote_path(text: str) -> str:
    """Inverse of :func:`quote_path` (also reads git's own quoted paths); ValueError if malformed."""
    if not (len(text) >= 2 and text.startswith('"') and text.endswith('"')):
        return text
    raw = bytearray()
    body = text[1:-1]
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            raw += ch.encode("utf-8", "surrogateescape")
            i += 1
            continue
        digits = body[i + 1:i + 4]
        if len(digits) == 3 and all(c in "01234567" for c in digits) and int(digits, 8) < 256:
            raw.append(int(digits, 8))
            i += 4
        elif digits[:1] and digits[0] in _UNESCAPES:
            raw += _UNESCAPES[digits[0]].encode()
            i += 2
        else:
            raise ValueError(f"malformed escape in the quoted path {text!r}")
    return raw.decode("utf-8", "surrogateescape")


_GIT_ID = re.compile(r"[0-9a-f]{40}")


def is_git_id(text: str) -> bool:
    """A full git object id as git prints it: 40 lowercase hex digits."""
    return _GIT_ID.fullmatch(text) is not None


def is_safe_relpath(path: str) -> bool:
    """A path relative to site-packages that stays inside it: no absolute, no ``..``."""
    # An empty, "." or ".." part shows in the path with a slash on each side as "//",
    # "/./" or "/../" (an empty path, a leading or trailing slash: "//"). Listings check
    # every row of every node: this is faster than splitting.
    wrapped = f"/{path}/"
    return "//" not in wrapped and "/./" not in wrapped and "/../" not in wrapped and "\0" not in path


def mode_kind(mode: int) -> str | None:
    if stat.S_ISLNK(mode):
        return LINK
    if stat.S_ISREG(mode):
        return FILE
    return None


@dataclass(frozen=True)
class DistInfo:
    """The installed distribution that owns a tracked tree (from ``*.dist-info``)."""

    name: str
    version: str
    dist_info: str  # folder name relative to site-packages


@dataclass(frozen=True)
class InstallInfo:
    """How the tracked package is installed at the node's root (the agent's ``locate``)."""

    how: str  # "wheel" | "editable" | "source"
    root: str  # the folder holding the package: site-packages, or a checkout's python/
    name: str = ""  # the distribution's name, or the package's without one
    version: str = ""
    url: str = ""  # an editable install's direct_url.json url
    checkout: str = ""  # the folder whose .git is nearest above the root; "" when none
    found_by: str = "config"  # "config" | "find_spec" | "purelib" (the Python's own, find_spec said nothing)
    problem: str = ""  # why find_spec did not say

    @property
    def from_source(self) -> bool:
        """An editable install or a source tree: no RECORD covers its files."""
        return self.how in ("editable", "source")

    def to_json(self) -> dict[str, str]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class NodeInfo:
    """Facts a node reports about itself when the agent starts."""

    hostname: str
    python_version: str
    python: str
    site_packages: str
    dists: tuple[DistInfo, ...] = ()
    install: InstallInfo | None = None

    def dist_summary(self) -> str:
        if not self.dists and self.install is not None and self.install.version:
            return f"{self.install.name} {self.install.version}"
        return ", ".join(f"{d.name} {d.version}" for d in self.dists) or "-"
