"""Pull: record live nodes' trees as snapshots, moving only content the store lacks.

Per node: one connection, one listing (the node hashes only files whose stat changed
since the last pull), then one stream of exactly the missing blobs. Across a group,
every missing blob is fetched from one node only, so identical nodes send listings,
not files (into an empty store, the first node up streams everything while the others
hash). All snapshots are written into one pack and become visible together at the end
(refs move in one transaction); a pull that dies leaves the store as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from operator import attrgetter
from pathlib import Path
from types import EllipsisType
from typing import Any, Callable, Iterable, Iterator, Sequence

import blake3

from snapver.config import NodeSpec
from snapver.errors import RefError, SnapverError, StoreError, TransportError
from snapver.model import Entry, Manifest, StatEntry
from snapver.ops.pristine import RECORD_PATH, SnapshotRecord, save_record_source, snapshot_record
from snapver.store import refs
from snapver.store.gc import maybe_compact
from snapver.store.git import run_git
from snapver.store.importer import Importer
from snapver.store.objects import ZERO_OID, blob_oid
from snapver.store.records import format_message, snapshot_meta
from snapver.store.repo import Store
from snapver.store.team import TeamView, writer_of
from snapver.transport.base import FileChanged, FileItem, Listing, StatKeys, StreamedFile, Transport
from snapver.transport.connect import Starting, open_transport

# Round trips slower than this suggest a far, slower link: compress the stream there.
# (Python zlib runs at ~30 MB/s on small cores, so on fast links it costs more than it saves.)
COMPRESS_RTT_SECONDS = 0.030

ProgressFn = Callable[[int, int], None]  # (files, bytes) just received


@dataclass
class NodePull:
    """What pulling one node did."""

    node: str
    snapshot: str | None = None
    unchanged_since: str | None = None
    files: int = 0
    changed: int = 0
    fetched_files: int = 0
    fetched_bytes: int = 0
    wire_bytes: int = 0
    seconds: float = 0.0
    dist: str = ""
    error: SnapverError | None = None
    # working state, not reported
    transport: Transport | None = field(default=None, repr=False)
    listing: Listing | None = field(default=None, repr=False)
    parent: str | None = field(default=None, repr=False)  # the node's newest snapshot by any writer
    own: str | None = field(default=None, repr=False)  # this store's branch head of the node
    parent_manifest: Manifest | None = field(default=None, repr=False)
    prefetch: Callable[[list[str]], Iterator[FileItem]] | None = field(default=None, repr=False)
    cache_time: int = field(default=0, repr=False)  # of the stat cache the listing used
    keys_missing: bool = field(default=False, repr=False)  # that cache has no stat keys file yet
    keys: StatKeys | None = field(default=None, repr=False)  # the stat keys its listing was sent
    record: SnapshotRecord | None = field(default=None, repr=False)  # the RECORD rows of its new snapshot
    started: float = field(default=0.0, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "ok": self.ok, "snapshot": self.snapshot,
                "unchanged_since": self.unchanged_since, "files": self.files, "changed": self.changed,
                "fetched_files": self.fetched_files, "fetched_bytes": self.fetched_bytes,
                "wire_bytes": self.wire_bytes, "seconds": round(self.seconds, 3), "dist": self.dist,
                "error": str(self.error) if self.error else None,
                "exit_code": self.error.exit_code if self.error else 0}


@dataclass
class PullResult:
    nodes: list[NodePull]
    compacting: int | None = None  # the process id of a background compaction this pull started

    @property
    def exit_code(self) -> int:
        return max((n.error.exit_code for n in self.nodes if n.error), default=0)


def stat_cache_path(store: Store, node: str) -> Path:
    """The node's stat cache: its last listing's rows and blob ids, and the snapshot they made."""
    return store.path / "snapver" / "stat-cache" / f"{node}.json"


_PATH = attrgetter("path")  # the order of a keys file's records, and of its cache's blob ids


def stat_keys_path(store: Store, node: str) -> Path:
    """Beside the stat cache: its stat keys as the node's ``list`` takes them (one line of
    JSON naming the commit and time, then the keys' JSON text compressed with zlib), so a
    re-pull sends them without parsing the cache, encoding or compressing them again
    (12,016 files: ~60 ms of client CPU before the node could start listing, then ~11 ms;
    the cache is parsed while the node lists, and only if a file changed)."""
    return store.path / "snapver" / "stat-cache" / f"{node}.keys"


def stat_keys_text(keys: Iterable[tuple[str, int, int, int, int, int]]) -> str:
    """The keys' JSON text from (path, size, mtime_ns, ctime_ns, ino, mode) of each file:
    one string of records, "path NUL size mtime_ns ctime_ns ino mode" each, two NULs between
    them (no path holds a NUL, none is empty). The node looks its files' records up in a
    set: a JSON object of lists, as older versions wrote, took ~5x longer to decode there
    (12,016 files: 15.6 ms) and ~1.5x to encode here. Sorted: ``records_digest`` of the
    string is what the node compares its own records with before it decodes these."""
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
    """``{path: (size, mtime_ns, ctime_ns, ino, mode)}`` of keys' JSON text (either form)."""
    value = json.loads(text)
    if isinstance(value, dict):  # written by an older snapver
        return value
    if not isinstance(value, str):
        raise ValueError("stat keys are neither records nor an object")
    if not value:
        return {}
    fields = value.split("\0")  # path, keys, "", path, keys, ...: every number parsed at once
    paths, keys = fields[0::3], fields[1::3]
    numbers = json.loads("[" + ",".join(keys).replace(" ", ",") + "]")
    if len(fields) != 3 * len(paths) - 1 or any(fields[2::3]) or len(numbers) != 5 * len(paths):
        raise ValueError("malformed stat keys")
    each = iter(numbers)
    return dict(zip(paths, zip(each, each, each, each, each)))


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
    holds the text as it is (as a pull writes them, and older snapvers did): it is
    compressed here."""
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
        files = files if isinstance(files, int) and not isinstance(files, bool) else None
        if header["commit"] != head or files == 0:  # no files: no delta
            return None
        if files is None and _no_keys(zlib.decompress(data) if packed else data):  # an older file, uncounted
            return None
        # The count serves to call the tree unchanged from the node's counts alone, which
        # holds only if the snapshot had nothing but files: its links and special files are
        # listed again at every pull, so one whose links were all removed since would look
        # unchanged (keys from before "others" was counted: never called so).
        # The digest of the records, and how many there are (the count of a header that has a digest).
        digest = header.get("records_digest")
        digest = (digest, files) if isinstance(digest, str) and files is not None else None
        if header.get("others") != 0:
            files = None
        if packed:
            return data, int(header["now_ns"]), files, None, digest
        return zlib.compress(data, 1), int(header["now_ns"]), files, header, digest
    except (OSError, ValueError, KeyError, TypeError, zlib.error):
        return None


def _no_keys(text: bytes) -> bool:
    """True for keys that name no file, or are not a JSON string or object (an older file)."""
    return not text.startswith((b'"', b"{")) or text in (b'""', b"{}")


def load_stat_cache(store: Store, node: str, head: str | None,
                    keys: tuple[str, int] | None = None) -> tuple[dict[str, StatEntry], int]:
    """The node's last listing, trusted only if it belongs to the snapshot at the tip.

    The cache holds the listing's blob ids, in the order of its stat keys (``keys``: their
    text and time, as ``load_stat_keys`` found them; None when it found none, and then
    only such a cache serves); both must be of the same listing (same commit and time). A
    cache an older snapver wrote holds whole rows instead.
    """
    path = stat_cache_path(store, node)
    try:
        data = json.loads(path.read_text())
        if head is None or not isinstance(data, dict) or data.get("commit") != head:
            return {}, 0
        now_ns = int(data["now_ns"])
        if "entries" in data:  # written before the cache held only blob ids
            return {p: StatEntry(p, "f", v[4], v[0], v[1], v[2], v[3], v[5])
                    for p, v in data["entries"].items()}, now_ns
        oids = data["oids"]
        if keys is None or keys[1] != now_ns:
            return {}, 0
        rows = parse_stat_keys(keys[0])
        if not isinstance(oids, list) or len(rows) != len(oids):
            return {}, 0
        return {p: StatEntry(p, "f", v[4], v[0], v[1], v[2], v[3], oid)
                for (p, v), oid in zip(rows.items(), oids)}, now_ns
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
    cache, cache_time = load_stat_cache(store, node, head)
    return transport.request_listing(cache, cache_time)


def save_stat_cache(store: Store, node: str, commit: str, listing: Listing) -> None:
    """Write the listing's stat keys, then its blob ids in the same order (the cache)."""
    path = stat_cache_path(store, node)
    files = sorted((e for e in listing.entries if e.kind == "f"), key=_PATH)
    # Keys first: keys whose cache file is older or newer than they are (a pull stopped
    # between the two writes, another version's cache) are never used with it.
    save_stat_keys(store, node, commit, listing.now_ns, files, len(listing.entries) - len(files))
    tmp = path.with_suffix(".tmp")
    # The ids alone: the keys file has the rest (one JSON encoding of 2,602 rows, not two).
    tmp.write_text(json.dumps({"commit": commit, "now_ns": listing.now_ns, "oids": [e.oid for e in files]},
                              separators=(",", ":")))
    os.replace(tmp, path)


def save_stat_keys(store: Store, node: str, commit: str, now_ns: int, files: list[StatEntry], others: int) -> None:
    """Write the stat keys of a listing's ``files`` (its regular files, sorted by path),
    made at ``now_ns``; the header also counts its ``others`` entries (links, special
    files), which have no keys."""
    path = stat_keys_path(store, node)
    records = _entries_records(files)
    header = {"commit": commit, "now_ns": now_ns, "files": len(files), "others": others,
              "records_digest": records_digest(records)}
    text = json.dumps(records)
    # As text: compressed by the first pull that sends them (which then keeps them so, see
    # keep_stat_keys_packed), not by every pull that writes them (a 16-node first pull: 16x).
    _write_stat_keys(path, header, text.encode("ascii"))


def keep_stat_keys_packed(store: Store, node: str, keys: StatKeys) -> None:
    """Keep the keys a re-pull sent, compressed as sent, if their file still holds them
    as text: the next re-pull sends them as they are (torch's 1.5 MB: ~11 ms of client CPU)."""
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
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".keys-tmp")
    tmp.write_bytes(json.dumps(header).encode("ascii") + b"\n" + data)
    os.replace(tmp, path)


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


def pull(store: Store, specs: list[NodeSpec], tag: str | None = None, message: str = "",
         on_plan: Callable[[int, int], None] | None = None, on_progress: ProgressFn | None = None,
         on_node_done: Callable[[NodePull], None] | None = None, starting: Starting | None = None) -> PullResult:
    """Snapshot every node in ``specs`` (in parallel), holding the store lock. Never changes a node.

    ``starting``: the nodes' connections, begun by the caller before it got here."""
    with store.lock():
        result = pull_locked(store, specs, tag, message, on_plan, on_progress, on_node_done, starting=starting)
    result.compacting = maybe_compact(store.path)
    return result


def pull_locked(store: Store, specs: list[NodeSpec], tag: str | None = None, message: str = "",
                on_plan: Callable[[int, int], None] | None = None, on_progress: ProgressFn | None = None,
                on_node_done: Callable[[NodePull], None] | None = None,
                open_transports: dict[str, Transport] | None = None,
                known_digests: dict[str, str] | None = None,
                event: dict[str, str] | None = None, starting: Starting | None = None) -> PullResult:
    """`pull` for a caller that already holds the store lock (push records before/after).

    ``open_transports`` are connections the caller already has (by node name): they are
    used instead of new ones and left open. ``known_digests``: blake3 digests by blob id
    of content the caller knows (what a push wrote), not to be read back from the store.
    ``event``: what made the snapshots, in their metadata (default ``{"event": "pull"}``;
    a push's: ``{"event": "push", "patch": NAME}``; a rollback's: ``{"event": "rollback"}``).
    """
    borrowed = {name: t for name, t in (open_transports or {}).items() if t is not None and t.is_open}
    results = [NodePull(spec.name, transport=borrowed.get(spec.name)) for spec in specs]
    by_name = {r.node: r for r in results}
    workers = max(1, min(32, len(specs)))
    # Hashing on the node only serves to skip content the store has; a first pull of a
    # single node into an empty store has none to skip, so it fetches without hashing.
    # Into an empty store, the first node of a group to start up is such a node: it lists
    # without hashing and streams everything at once, while the others start up and hash;
    # they then send only what it did not have.
    heads, newest = newest_heads(store)  # each node's last snapshot: one git, not one per node
    for result in results:
        result.own = heads.get(refs.node_ref(result.node))
    empty = not heads and not newest
    hash_on_node = len(specs) > 1 or not empty
    first = _First() if empty and len(specs) > 1 else None
    closed: set[str] = set()

    def close_connections() -> None:
        """Close our connections (once each). In parallel: a close may wait for its agent to
        exit (a local one, or one still busy after an error); 16 such waits in a row were 0.26 s."""
        owned = [r for r in results if r.transport is not None and r.node not in borrowed and r.node not in closed]
        closed.update(r.node for r in owned)
        list(pool.map(lambda r: r.transport.close(), owned))

    with ThreadPoolExecutor(workers) as pool:
        try:
            with store.importer() as importer:
                digests: dict[str, str] = dict(known_digests or {})

                def list_node(spec: NodeSpec, result: NodePull) -> None:
                    _list_node(store, spec, result, hash_on_node, newest, first, starting)
                    if first is not None and first.node == result.node and result.ok:
                        assert result.listing is not None
                        if on_plan:
                            on_plan(len(result.listing.entries), sum(e.size for e in result.listing.entries))
                        _fetch(result, result.listing.entries, importer, digests, on_progress)

                list(pool.map(list_node, specs, results))
                live = [r for r in results if r.ok]
                # A node that found every file as its last snapshot's cache says has nothing to fetch.
                others = [r for r in live if (first is None or r.node != first.node) and not _as_last_time(r)]
                assignments = _assign_fetches(store, others, importer)
                if on_plan:
                    sent = [r for r in live if first is not None and r.node == first.node]
                    on_plan(sum(r.fetched_files for r in sent) + sum(len(a) for a in assignments.values()),
                            sum(r.fetched_bytes for r in sent) + sum(e.size for a in assignments.values() for e in a))
                list(pool.map(lambda r: _fetch(r, assignments.get(r.node, []), importer, digests, on_progress),
                              live))
                # Blobs a failed node was to bring, or that changed under us: each node fetches its own.
                live = [r for r in live if r.ok]
                list(pool.map(lambda r: _fetch(r, _still_missing(store, importer, r), importer, digests,
                                               on_progress), [r for r in live if not _as_last_time(r)]))
                marks = {}
                manifests: SharedManifests = {}
                records: dict[str, SnapshotRecord] | None = {} if len(live) > 1 else None
                for result in (r for r in live if r.ok):
                    try:
                        mark = _record(store, importer, result, digests, message, manifests, event, records)
                        if mark is not None:
                            marks[result.node] = mark
                    except SnapverError as exc:
                        result.error = exc
                    # Counted after the record: a RECORD read belongs to the pull's bytes too.
                    transport = result.transport
                    assert transport is not None
                    result.wire_bytes = transport.bytes_received + transport.bytes_sent
                # Nothing more to ask the nodes: their buffers are freed before the store's
                # write finishes (a 1 GB first pull's memory peaks there).
                close_connections()
        except SnapverError as exc:
            for result in results:
                if result.ok:
                    result.error = exc
            marks = {}
        finally:
            close_connections()
        for node, mark in marks.items():
            result = by_name[node]
            result.snapshot = importer.results[mark]
        for result in results:
            if result.ok and result.listing is not None:
                head = result.snapshot or result.unchanged_since
                # A cache the node found exactly as it was stays as it is (its time too:
                # every file it trusts was trusted at that time, and is still unchanged).
                if head and not (result.listing.as_cached and head == result.parent):
                    save_stat_cache(store, result.node, head, result.listing)
                elif head and result.keys_missing:  # a cache an older snapver wrote: add its keys
                    entries = result.listing.entries
                    files = sorted((e for e in entries if e.kind == "f"), key=_PATH)
                    save_stat_keys(store, result.node, head, result.cache_time, files, len(entries) - len(files))
                elif head and result.keys is not None:
                    keep_stat_keys_packed(store, result.node, result.keys)
                if result.snapshot and result.record is not None:
                    save_record_source(store, result.node, result.snapshot, result.record.source)
                if tag and head:
                    _tag(store, tag if len(specs) == 1 else f"{tag}-{result.node}", head, result)
            result.seconds = time.monotonic() - result.started
            if on_node_done:
                on_node_done(result)
    return PullResult(results)


def _tag(store: Store, name: str, head: str, result: NodePull) -> None:
    """Create tag ``name`` at ``head`` only where no tag is (compare-and-swap: the caller
    checked before pulling, another command may have made it since). One made meanwhile
    is left as it is; the node's result says so (its snapshot is recorded, untagged)."""
    ref = refs.tag_ref(name)
    try:
        store.update_ref(ref, head, ZERO_OID)
    except StoreError as exc:
        now = store.ref(ref)
        if now == head:
            return
        if now is None:  # not there: the write itself failed (an unwritable store)
            result.error = exc
            return
        result.error = RefError(f"tag {name!r} was made by another command meanwhile (it names "
                                f"{now[:10]}): snapshot {head[:10]} is recorded, untagged",
                                hint=f"tag it under another name, or move the tag with `snapver tag --force {name} "
                                f"{head[:10]}`")


def _as_last_time(result: NodePull) -> bool:
    """True when the node listed exactly its last snapshot: the stat cache it was given
    belongs to that snapshot (``load_stat_keys``/``load_stat_cache`` check its commit) and
    the node found every cached file unchanged, and nothing else (no file, link or special
    file the cache does not hold, none gone): no blob to look for, no tree to compare."""
    listing = result.listing
    if listing is None or not listing.as_cached or result.parent is None:
        return False
    return listing.rows_omitted > 0 or (result.parent_manifest is not None
                                        and len(result.parent_manifest) == len(listing.entries))


class _First:
    """Which node of a group had its agent up first (thread-safe)."""

    def __init__(self) -> None:
        self.node: str | None = None
        self._lock = threading.Lock()

    def claim(self, node: str) -> bool:
        with self._lock:
            if self.node is None:
                self.node = node
            return self.node == node


def _list_node(store: Store, spec: NodeSpec, result: NodePull, hash_on_node: bool, heads: dict[str, str],
               first: _First | None = None, starting: Starting | None = None) -> None:
    """Connect and list; ``heads``: every node's newest snapshot (``newest_heads``), this one's the parent."""
    result.started = time.monotonic()
    try:
        result.parent = heads.get(refs.node_ref(spec.name))
        keys, cache_time = load_stat_keys(store, spec.name, result.parent)
        result.keys = keys
        cache: dict[str, StatEntry] = {}
        if keys is None:
            cache, cache_time = load_stat_cache(store, spec.name, result.parent)
            result.keys_missing = bool(cache)
        result.cache_time = cache_time
        if result.transport is None:
            result.transport = (starting and starting.take(spec.name)) or open_transport(spec).start()
        if first is not None:
            result.transport.info  # noqa: B018 - wait for the agent: is this node the first up?
            hash_on_node = not first.claim(spec.name)
        # Every file will be fetched when the node does not hash: have it stream them right
        # after its listing (the level first: finding it may take a request of its own).
        level = None if hash_on_node else _compress_level(result.transport)
        listing = result.transport.request_listing(cache, cache_time, want_oids=hash_on_node, cache_keys=keys,
                                                   rows_if_unchanged=False)
        if level is not None:
            result.prefetch = result.transport.request_listed_files(level)
        if keys is None:  # read the last snapshot while the node starts up and lists
            _read_parent(store, result)
            result.listing = listing()
        else:
            # Against stat keys, an unchanged tree (the usual re-pull) needs neither the last
            # snapshot's manifest nor the cache's rows: read them only if something changed
            # (torch's 12,016 files: ~55 ms of client CPU, which the node's listing shares
            # when both run on one machine).
            result.listing = listing()
            if not result.listing.rows_omitted:
                _read_parent(store, result)
        info = result.transport.info
        assert info is not None
        result.dist = info.dist_summary()
    except SnapverError as exc:
        result.error = exc


def _read_parent(store: Store, result: NodePull) -> None:
    """The manifest of the node's last snapshot; its blobs are all in the store."""
    result.parent_manifest = store.manifest(result.parent) if result.parent else None
    if result.parent_manifest is not None:
        store.note_present(e.oid for e in result.parent_manifest.entries.values())


def _assign_fetches(store: Store, nodes: list[NodePull], importer: Importer) -> dict[str, list[StatEntry]]:
    """Give each blob the store lacks to the first node that has it (unhashed files: all)."""
    all_oids = {e.oid for r in nodes for e in r.listing.entries if e.oid}  # type: ignore[union-attr]
    fetched = all_oids & importer.written()  # from the node that sent everything first
    # Blobs of the nodes' last snapshots are in the store: ask git only about the others.
    # (Unordered: a Manifest iterates sorted. Identical nodes share one parsed manifest.)
    parents = {id(r.parent_manifest): r.parent_manifest for r in nodes if r.parent_manifest}
    recorded = {e.oid for manifest in parents.values() for e in manifest.entries.values()}
    have = fetched | (all_oids & recorded) | store.existing(all_oids - recorded - fetched)
    assigned: dict[str, list[StatEntry]] = {}
    for result in nodes:
        mine = assigned.setdefault(result.node, [])
        for entry in result.listing.entries:  # type: ignore[union-attr]
            if entry.oid is None or entry.oid not in have:
                mine.append(entry)
                if entry.oid:
                    have.add(entry.oid)
    return assigned


def _still_missing(store: Store, importer: Importer, result: NodePull) -> list[StatEntry]:
    recorded = {e.oid for e in result.parent_manifest.entries.values()} if result.parent_manifest else set()
    written = importer.written()
    candidates = [e for e in result.listing.entries  # type: ignore[union-attr]
                  if e.oid not in recorded and e.oid not in written]
    if not candidates:
        return []
    have = store.existing(e.oid for e in candidates)
    return [e for e in candidates if e.oid not in have]


def _fetch(result: NodePull, entries: list[StatEntry], importer: Importer, digests: dict[str, str],
           on_progress: ProgressFn | None) -> None:
    if not entries or not result.ok:
        return
    assert result.transport is not None and result.listing is not None
    by_path = {e.path: e for e in entries}
    if result.prefetch is not None:  # asked for with the listing: the whole listing streams
        stream = result.prefetch([e.path for e in result.listing.entries])
        result.prefetch = None
    else:
        stream = result.transport.stream_files(list(by_path), compress_level=_compress_level(result.transport))
    changed: dict[str, StatEntry | None] = {}
    try:
        for path, kind, data in stream:
            listed = by_path.get(path)
            if listed is None:
                continue
            if kind is None:
                changed[path] = None  # vanished since the listing
                continue
            if isinstance(data, StreamedFile):
                # Hashed (blob id, blake3) and written as it arrives, never held whole.
                content = blake3.blake3()
                try:
                    oid = importer.add_blob_stream(data.size, data, (content, _Progress(on_progress)))
                except FileChanged:
                    continue  # the node read it again: the next item is this path once more
                digest, size = content.hexdigest(), data.size
                unreported = 0  # its bytes were reported piece by piece
            else:
                oid = importer.add_blob(data)
                digest, size = blake3.blake3(data).hexdigest(), len(data)
                unreported = size
            digests[oid] = digest
            result.fetched_files += 1
            result.fetched_bytes += size
            if oid != listed.oid or kind != listed.kind:
                changed[path] = StatEntry(path, kind, listed.mode, size, listed.mtime_ns,
                                          listed.ctime_ns, listed.ino, oid, listed.target)
            if on_progress:
                on_progress(1, unreported)
    except TransportError as exc:
        # This node failed; a store error (disk full) is not caught here: it ends the pull.
        result.error = exc
        return
    if changed:
        # The file changed between listing and reading: record what was read.
        kept = [changed.get(e.path, e) for e in result.listing.entries]
        result.listing = Listing(result.listing.now_ns, [e for e in kept if e is not None],
                                 result.listing.hashed)


class _Progress:
    """A streamed file's bytes reported as they arrive (a digest-like sink)."""

    def __init__(self, on_progress: ProgressFn | None) -> None:
        self.on_progress = on_progress

    def update(self, piece: bytes | memoryview) -> None:
        if self.on_progress:
            self.on_progress(0, len(piece))


def _compress_level(transport: Transport) -> int:
    """zlib level for a file stream: 1 when configured, or on slow links when ``auto``."""
    compress = transport.spec.compress
    return 1 if compress == "zlib" or (compress == "auto" and _far(transport)) else 0


def _far(transport: Transport, tries: int = 2) -> bool:
    """Each of ``tries`` round trips slower than COMPRESS_RTT_SECONDS. One slow answer may
    be a busy moment, not a far link: a fleet's first node is asked while the others start
    up on the same client; 1 in 3 such pulls of 16 loopback nodes got 31-40 ms and
    compressed (~0.15 s more client CPU, and the node's). A far link pays one more round trip."""
    return all(transport.ping() > COMPRESS_RTT_SECONDS for _ in range(tries))


# The manifests built in one pull, by what their listings hold: (path, kind, mode, size, blob id) each.
SharedManifests = dict[tuple[tuple[str, str, int, int, str | None], ...], Manifest]


def _record(store: Store, importer: Importer, result: NodePull, digests: dict[str, str],
            message: str, manifests: SharedManifests, event: dict[str, str] | None = None,
            records: dict[str, SnapshotRecord] | None = None) -> int | None:
    """Build the node's manifest; write a snapshot commit unless nothing changed.

    ``manifests``: those built so far in this pull, by what they hold; a node whose
    listing holds the same paths, kinds, modes, sizes and blobs shares one (a fleet of
    identical nodes builds, and the store serializes, one manifest instead of 16).
    ``records``: the RECORD rows made so far in this pull (None for a single node).
    """
    assert result.listing is not None and result.transport is not None
    previous = result.parent_manifest
    result.files = len(result.listing.entries) or result.listing.rows_omitted
    if _as_last_time(result) or (previous is not None and same_tree(previous, result.listing.entries)):
        result.unchanged_since = result.parent
        return None
    key = tuple([(e.path, e.kind, e.mode, e.size, e.oid) for e in result.listing.entries])
    manifest = manifests.get(key)
    if manifest is None:
        manifest = manifests[key] = _manifest(store, result.listing.entries, digests, previous)
    result.changed = count_changes(previous, manifest) if previous is not None else len(manifest)
    if previous is not None and result.changed == 0:
        result.unchanged_since = result.parent
        return None
    info = result.transport.info
    spec = result.transport.spec
    assert info is not None
    now = datetime.now(timezone.utc)
    meta = snapshot_meta(node=spec.name, host=spec.address, writer=writer_of(store), info=info, when=now,
                         paths=spec.paths, exclude=spec.exclude, manifest=manifest, changed=result.changed,
                         event=event, message=message)
    subject = f"{spec.name}: {len(manifest)} files, {result.changed} changed ({info.dist_summary()})"
    # The distribution's RECORD rows, so that a rebase onto this snapshot can tell a file
    # the release ships from one a pip upgrade left behind (ops/pristine.py).
    record = result.record = snapshot_record(store, result.transport, result.parent, records)
    also: tuple[str, ...] = ()
    ref_at = None
    if result.own != result.parent:
        # A teammate's snapshot is the newest: the new one's first parent (what it changes
        # from); this store's branch moves forward from its own head, kept as a second
        # parent unless the first contains it already.
        ref_at = result.own or ZERO_OID
        if result.own and run_git(store.path, "merge-base", "--is-ancestor", result.own,
                                  result.parent or result.own).returncode != 0:
            also = (result.own,)
    return importer.commit(refs.node_ref(spec.name), result.parent, manifest,
                           format_message(subject, meta, message), now,
                           extra_files={RECORD_PATH: record.data} if record and record.data is not None else None,
                           stored_files={RECORD_PATH: record.oid} if record and record.oid else None,
                           also_parents=also, ref_at=ref_at)


def _manifest(store: Store, entries: list[StatEntry], digests: dict[str, str], previous: Manifest | None) -> Manifest:
    """The manifest of a listing: blake3 digests from this pull's fetches, the previous
    snapshot, or else the blobs in the store (read back and checked)."""
    known = {e.oid: e.digest for e in previous.entries.values()} if previous else {}
    unknown = [e.oid for e in entries if e.oid not in digests and e.oid not in known]
    if unknown:
        for oid, data in store.read_blobs(unknown):
            if blob_oid(data) != oid:
                raise StoreError(f"object {oid} in the store does not match its id")
            digests[oid] = blake3.blake3(data).hexdigest()
    return Manifest.of(Entry(e.path, e.kind, e.mode, e.size, digests.get(e.oid) or known[e.oid], e.oid)
                       for e in entries)


def same_tree(manifest: Manifest, entries: list[StatEntry]) -> bool:
    """True when a listing holds exactly the manifest's paths, each with the same kind,
    mode and blob (so the same content): the common unchanged re-pull, decided without
    building a new manifest."""
    if len(entries) != len(manifest):
        return False
    recorded = manifest.entries
    for entry in entries:
        old = recorded.get(entry.path)
        if old is None or old.oid != entry.oid or old.mode != entry.mode or old.kind != entry.kind:
            return False
    return True


def count_changes(old: Manifest, new: Manifest) -> int:
    """Paths added, removed, or whose kind, content or mode changed."""
    changed = sum(1 for e in new.entries.values() if (o := old.get(e.path)) is None or not o.same_content(e))
    return changed + sum(1 for path in old.entries if path not in new.entries)
