"""Live listing: what a node holds now, and the stat cache that spares re-hashing it.

A node re-hashes only files whose stat changed since the last pull (as git trusts its
index): the client sends the stat keys of the node's newest snapshot, kept beside the
store (``<store>/snapver/stat-cache/``), and reads back only what moved.
"""

from __future__ import annotations

import hashlib
import json
import zlib
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter
from pathlib import Path
from types import EllipsisType
from typing import Any

from snapver.model import FILE, StatEntry
from snapver.store import refs
from snapver.store.cache import (
    STAT_CACHE_VERSION,
    STAT_KEYS_VERSION,
    of_version,
    stat_cache_path,
    stat_keys_path,
    write_atomic,
)
from snapver.store.repo import Store
from snapver.store.team import TeamView
from snapver.transport.base import Listing, StatKeys, Transport

BY_PATH = attrgetter("path")  # the order of a keys file's records, and of its cache's blob ids


def stat_keys_text(keys: Iterable[tuple[str, int, int, int, int, int]]) -> str:
    """The keys' JSON text from (path, size, mtime_ns, ctime_ns, ino, mode) of each file:
    one string of records, "path NUL size mtime_ns ctime_ns ino mode" each, two NULs between
    them (no path holds a NUL, none is empty): the node looks its files' records up in a
    set, and one string decodes faster there than an object of lists. Sorted:
    ``records_digest`` of the string is what the node compares its own records with
    before it decodes these."""
    return json.dumps(records_text(keys))


# A file's record: "path NUL size mtime_ns ctime_ns ino mode" (the agent's op_list spells it alike).
STAT_RECORD = "%s\0%d %d %d %d %d"


def records_text(keys: Iterable[tuple[str, int, int, int, int, int]]) -> str:
    """The records of ``stat_keys_text``, sorted, as one string."""
    return "\0\0".join(sorted([STAT_RECORD % key for key in keys]))


def _entries_records(files: list[StatEntry]) -> str:
    """``records_text`` of files already sorted by path (a record sorts as its path: NUL
    sorts before any character a path holds), made from the entries straight."""
    return "\0\0".join([STAT_RECORD % (e.path, e.size, e.mtime_ns, e.ctime_ns, e.ino, e.mode) for e in files])


def records_digest(text: str) -> str:
    """The digest a node compares with that of its files' records (agent ``_Records``)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=32).hexdigest()


def parse_stat_keys(text: str) -> dict[str, Sequence[int]]:
    """``{path: (size, mtime_ns, ctime_ns, ino, mode)}`` of keys' JSON text (a string of records)."""
    value = json.loads(text)
    if not isinstance(value, str):
        raise ValueError("stat keys are not a string of records")
    if not value:
        return {}
    fields = value.split("\0")  # path, keys, "", path, keys, ...: every number parsed at once
    paths, keys = fields[0::3], fields[1::3]
    numbers = json.loads("[" + ",".join(keys).replace(" ", ",") + "]")
    if len(fields) != 3 * len(paths) - 1 or any(fields[2::3]) or len(numbers) != 5 * len(paths):
        raise ValueError("malformed stat keys")
    each = iter(numbers)
    return dict(zip(paths, zip(each, each, each, each, each, strict=False), strict=False))


def load_stat_keys(store: Store, node: str, head: str | None) -> tuple[StatKeys | None, int]:
    """The node's stat keys and the cache's time, if written with the cache of snapshot ``head``.

    Their ``read_cache`` gives the cache's entries only if the cache file is still the one
    written with them (same commit and time), else None."""
    found = _read_stat_keys(store, node, head)
    if found is None:
        return None, 0
    packed, cache_time, files, header, digest = found

    def read_cache() -> dict[str, StatEntry] | None:
        try:
            text = zlib.decompress(packed).decode("ascii")
        except (zlib.error, UnicodeDecodeError):
            return None
        entries, now_ns = load_stat_cache(store, node, head, (text, cache_time))
        return entries if entries and now_ns == cache_time else None

    return StatKeys(packed, read_cache, files, header, digest), cache_time


def read_stat_keys_file(path: Path) -> tuple[dict[str, Any], bytes]:
    """A keys file's header (commit, time, how many files) and its keys' JSON text,
    compressed with zlib (as the node is sent them). A file with no ``zlib`` in its header
    holds the text as it is (as a pull writes them): it is compressed here."""
    header, data = _read_keys_file(path)
    return header, data if header.get("zlib") else zlib.compress(data, 1)


def _read_keys_file(path: Path, header_only: bool = False) -> tuple[dict[str, Any], bytes]:
    """A keys file's header and the rest of it as it is on disk (nothing with ``header_only``)."""
    with open(path, "rb") as handle:
        header = json.loads(handle.readline())
        data = b"" if header_only else handle.read()
    if not isinstance(header, dict):
        raise ValueError("the keys file's header is not a JSON object")
    return header, data


def _read_stat_keys(store: Store, node: str, head: str | None
                    ) -> tuple[bytes, int, int | None, dict[str, Any] | None, tuple[str, int] | None] | None:
    """(keys' compressed JSON text, cache time, how many files, the header if the file holds
    them as text, the records' digest and count if written with one) of snapshot ``head``'s keys file,
    or None."""
    if head is None:
        return None
    try:
        header, data = _read_keys_file(stat_keys_path(store, node))
        packed = header.get("zlib")
        files = header.get("files")
        records = header.get("records_digest")
        if not of_version(header, STAT_KEYS_VERSION) or not isinstance(records, str) \
                or not isinstance(files, int) or isinstance(files, bool):
            return None  # another version, or a header without what its version writes: a miss
        if header["commit"] != head or files == 0:  # no files: no delta
            return None
        # The count serves to call the tree unchanged from the node's counts alone, which
        # holds only if the snapshot had nothing but files: its links and special files are
        # listed again at every pull, so one whose links were all removed since would look
        # unchanged. The digest of the records goes with how many there are.
        digest: tuple[str, int] | None = (records, files)
        if header.get("others") != 0:
            files = None
        if packed:
            return data, int(header["now_ns"]), files, None, digest
        return zlib.compress(data, 1), int(header["now_ns"]), files, header, digest
    except (OSError, ValueError, KeyError, TypeError, zlib.error):
        return None


def load_stat_cache(store: Store, node: str, head: str | None,
                    keys: tuple[str, int]) -> tuple[dict[str, StatEntry], int]:
    """The node's last listing, trusted only if it belongs to the snapshot at the tip.

    The cache holds the listing's blob ids, in the order of its stat keys (``keys``: their
    text and time, as ``load_stat_keys`` found them); both must be of the same listing
    (same commit and time).
    """
    path = stat_cache_path(store, node)
    try:
        data = json.loads(path.read_text())
        if head is None or not isinstance(data, dict) or data.get("commit") != head \
                or not of_version(data, STAT_CACHE_VERSION):
            return {}, 0
        now_ns = int(data["now_ns"])
        oids = data["oids"]
        if keys[1] != now_ns:
            return {}, 0
        rows = parse_stat_keys(keys[0])
        if not isinstance(oids, list) or len(rows) != len(oids):
            return {}, 0
        return {p: StatEntry(p, FILE, v[4], v[0], v[1], v[2], v[3], oid)
                for (p, v), oid in zip(rows.items(), oids, strict=False)}, now_ns
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return {}, 0


def list_live(store: Store | None, transport: Transport, checksum: bool = False) -> Listing:
    """A node's live tree with every file's git blob id.

    The node re-hashes only files whose stat (size, mtime, ctime, inode, mode) changed
    since the last pull, as git trusts its index; a write always moves ctime, and files
    touched within 2 s of that pull are re-hashed anyway (racy timestamps).
    ``checksum`` hashes every file, like ``rsync -c``.
    """
    return request_live(store, transport, checksum)()


def request_live(store: Store | None, transport: Transport, checksum: bool = False,
                 head: str | None | EllipsisType = ...) -> Callable[[], Listing]:
    """``list_live`` in two steps: ask the node now, wait for the listing later. ``head``:
    the node's newest snapshot by any writer (``newest_heads``), when the caller has it."""
    if store is None or checksum:
        return transport.request_listing()
    node = transport.spec.name
    if head is ...:
        head = newest_heads(store)[1].get(refs.node_ref(node))
    keys, cache_time = load_stat_keys(store, node, head)
    if keys is not None:
        return transport.request_listing(cache_time_ns=cache_time, cache_keys=keys)
    return transport.request_listing()


def save_stat_cache(store: Store, node: str, commit: str, listing: Listing) -> None:
    """Write the listing's stat keys, then its blob ids in the same order (the cache)."""
    path = stat_cache_path(store, node)
    files = sorted((e for e in listing.entries if e.kind == FILE), key=BY_PATH)
    # Keys first: keys whose cache file is older or newer than they are (a pull stopped
    # between the two writes, another version's cache) are never used with it.
    save_stat_keys(store, node, commit, listing.now_ns, files, len(listing.entries) - len(files))
    # The ids alone: the keys file has the rest (one JSON encoding of the rows, not two).
    write_atomic(path, json.dumps({"v": STAT_CACHE_VERSION, "commit": commit, "now_ns": listing.now_ns,
                                   "oids": [e.oid for e in files]}, separators=(",", ":")).encode("ascii"))


def save_stat_keys(store: Store, node: str, commit: str, now_ns: int, files: list[StatEntry], others: int) -> None:
    """Write the stat keys of a listing's ``files`` (its regular files, sorted by path),
    made at ``now_ns``; the header also counts its ``others`` entries (links, special
    files), which have no keys."""
    path = stat_keys_path(store, node)
    records = _entries_records(files)
    header = {"v": STAT_KEYS_VERSION, "commit": commit, "now_ns": now_ns, "files": len(files), "others": others,
              "records_digest": records_digest(records)}
    text = json.dumps(records)
    # As text: compressed by the first pull that sends them (which then keeps them so, see
    # keep_stat_keys_packed), not by every pull that writes them (a fleet's first pull).
    _write_stat_keys(path, header, text.encode("ascii"))


def keep_stat_keys_packed(store: Store, node: str, keys: StatKeys) -> None:
    """Keep the keys a re-pull sent, compressed as sent, if their file still holds them
    as text: the next re-pull sends them as they are, without compressing them again."""
    if keys.header is None:
        return
    path = stat_keys_path(store, node)
    try:
        header, _ = _read_keys_file(path, header_only=True)
    except (OSError, ValueError):
        return
    if header == keys.header:  # still that file (under the store lock, no other pull writes it)
        _write_stat_keys(path, {**header, "zlib": 1}, keys.packed)


def _write_stat_keys(path: Path, header: dict[str, Any], data: bytes) -> None:
    write_atomic(path, json.dumps(header).encode("ascii") + b"\n" + data)


def newest_heads(store: Store) -> tuple[dict[str, str], dict[str, str]]:
    """This store's branch heads (``Store.heads("refs/heads/")``), and each node's newest
    snapshot by any writer (``{node ref: commit}``, what ``NODE@latest`` names), from one git.

    A pull compares a node with its newest snapshot, a teammate's too (synced here): the
    same tree is no new snapshot, and what a teammate recorded is not fetched again. In a
    store that never synced, both are its own heads."""
    every = store.heads("refs/")
    own = {name: commit for name, commit in every.items() if name.startswith("refs/heads/")}
    if not any(name.startswith(refs.TEAM) for name in every):
        return own, own
    view = TeamView(store, {name[len("refs/"):]: commit for name, commit in every.items()})
    return own, {refs.node_ref(node): commit for node, commit in view.merged(refs.NODES).items()}
