"""The snapshot engine: record live nodes' trees as snapshots, moving only content the store lacks.

Per node: one connection, one listing (the node hashes only files whose stat changed
since the last pull), then one stream of exactly the missing blobs. Across a group,
every missing blob is fetched from one node only, so identical nodes send listings,
not files (into an empty store, the first node up streams everything while the others
hash). All snapshots are written into one pack and become visible together at the end
(refs move in one transaction); a run that dies leaves the store as it was.

Both `pull` (the verb) and push/rollback (snapshots before and after) call ``pull_locked``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import blake3

from snapver.config import NodeSpec
from snapver.environment import ENV_PATH, Environment
from snapver.errors import RefError, SnapverError, StoreError, TransportError
from snapver.model import ZERO_OID, Entry, Manifest, StatEntry
from snapver.ops.envrecord import recorded_env_oid, remember_env_oid, remembered_env
from snapver.ops.layer import request_identity
from snapver.ops.live import (
    BY_PATH,
    keep_stat_keys_packed,
    load_stat_keys,
    newest_heads,
    save_stat_cache,
)
from snapver.ops.pristine import RECORD_PATH, SnapshotRecord, save_record_source, snapshot_record
from snapver.store import refs
from snapver.store.git import run_git
from snapver.store.importer import Importer
from snapver.store.objects import blob_oid
from snapver.store.records import format_message, snapshot_meta
from snapver.store.repo import Store
from snapver.store.team import writer_of
from snapver.transport.base import FileChanged, FileItem, Listing, StatKeys, StreamedFile, Transport
from snapver.transport.connect import Starting, open_transport

# Round trips slower than this suggest a far, slower link: compress the stream there
# (on fast links zlib costs more CPU time than it saves on the wire).
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
    container: dict[str, Any] | None = None  # its container's ids, when a snapshot is recorded (ops/layer.py)
    error: SnapverError | None = None
    environment: Environment | None = None  # as the node reported it; None: not read (env_note says why)
    env_note: str = ""
    env_changed: bool = False  # the new snapshot records another environment than its parent
    # working state, not reported
    transport: Transport | None = field(default=None, repr=False)
    listing: Listing | None = field(default=None, repr=False)
    parent: str | None = field(default=None, repr=False)  # the node's newest snapshot by any writer
    own: str | None = field(default=None, repr=False)  # this store's branch head of the node
    parent_manifest: Manifest | None = field(default=None, repr=False)
    prefetch: Callable[[list[str]], Iterator[FileItem]] | None = field(default=None, repr=False)
    keys: StatKeys | None = field(default=None, repr=False)  # the stat keys its listing was sent
    record: SnapshotRecord | None = field(default=None, repr=False)  # the RECORD rows of its new snapshot
    env_oid: str | None = field(default=None, repr=False)  # the blob id of ``environment``
    env_mark: str = field(default="", repr=False)  # what the agent read it from, summed up
    parent_env: str | None = field(default=None, repr=False)  # that of the parent's, once looked up
    started: float = field(default=0.0, repr=False)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, object]:
        return {"node": self.node, "ok": self.ok, "snapshot": self.snapshot,
                "unchanged_since": self.unchanged_since, "files": self.files, "changed": self.changed,
                "fetched_files": self.fetched_files, "fetched_bytes": self.fetched_bytes,
                "wire_bytes": self.wire_bytes, "seconds": round(self.seconds, 3), "dist": self.dist,
                "container": self.container,
                "environment": self.environment.summary() if self.environment else None,
                "env_changed": self.env_changed, "env_note": self.env_note or None,
                "error": str(self.error) if self.error else None,
                "exit_code": self.error.exit_code if self.error else 0}


@dataclass
class PullResult:
    nodes: list[NodePull]
    compacting: int | None = None  # the process id of a background compaction this pull started

    @property
    def exit_code(self) -> int:
        return max((n.error.exit_code for n in self.nodes if n.error), default=0)


def pull_locked(store: Store, specs: list[NodeSpec], tag: str | None = None, message: str = "",
                on_plan: Callable[[int, int], None] | None = None, on_progress: ProgressFn | None = None,
                on_node_done: Callable[[NodePull], None] | None = None,
                open_transports: dict[str, Transport] | None = None,
                known_digests: dict[str, str] | None = None,
                event: dict[str, str] | None = None, starting: Starting | None = None) -> PullResult:
    """Snapshot every node in ``specs`` (in parallel), for a caller that holds the store lock
    (`pull`; push and rollback, before and after they write). Never changes a node.

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
        exit (a local one, or one still busy after an error)."""
        owned = [r for r in results if r.transport is not None and r.node not in borrowed and r.node not in closed]
        closed.update(r.node for r in owned)
        list(pool.map(lambda r: r.transport.close(), owned))

    with ThreadPoolExecutor(workers) as pool:
        try:
            with store.importer() as importer:
                digests: dict[str, str] = dict(known_digests or {})
                live = _list_and_fetch(store, specs, results, pool, importer, digests, hash_on_node, newest, first,
                                       starting, on_plan, on_progress)
                marks = _record_all(store, importer, live, digests, message, event, specs)
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
                _keep_side_files(store, result, tag, len(specs))
            result.seconds = time.monotonic() - result.started
            if on_node_done:
                on_node_done(result)
    return PullResult(results)


def _list_and_fetch(store: Store, specs: list[NodeSpec], results: list[NodePull], pool: ThreadPoolExecutor,
                    importer: Importer, digests: dict[str, str], hash_on_node: bool, newest: dict[str, str],
                    first: _First | None, starting: Starting | None, on_plan: Callable[[int, int], None] | None,
                    on_progress: ProgressFn | None) -> list[NodePull]:
    """List every node, then fetch each blob the store lacks from one node: the nodes still
    without an error."""

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
    return live


def _record_all(store: Store, importer: Importer, live: list[NodePull], digests: dict[str, str], message: str,
                event: dict[str, str] | None, specs: list[NodeSpec]) -> dict[str, int]:
    """Write a snapshot commit of each node still without an error: its mark, by node."""
    marks = {}
    manifests: SharedManifests = {}
    records: dict[str, SnapshotRecord] | None = {} if len(live) > 1 else None
    # The container ids of the nodes that may record a snapshot, asked of their engines at once.
    by_spec = {spec.name: spec for spec in specs}
    for result, ids in [(r, request_identity(by_spec[r.node])) for r in live if not _as_last_time(r)]:
        result.container = ids()
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
    return marks


def _keep_side_files(store: Store, result: NodePull, tag: str | None, nodes: int) -> None:
    """After the store's write: the node's stat cache (and keys), its RECORD's source, its tag."""
    assert result.listing is not None
    head = result.snapshot or result.unchanged_since
    # A cache the node found exactly as it was stays as it is (its time too:
    # every file it trusts was trusted at that time, and is still unchanged).
    if head and not (result.listing.as_cached and head == result.parent):
        save_stat_cache(store, result.node, head, result.listing)
    elif head and result.keys is not None:
        keep_stat_keys_packed(store, result.node, result.keys)
    if result.snapshot and result.record is not None:
        save_record_source(store, result.node, result.snapshot, result.record.source)
    # Kept for a new snapshot, or for the last one when the node read the same environment
    # whole (a side file without a mark, or files touched): its mark is then the new one.
    if head and result.env_oid and (result.snapshot or (result.environment is not None
                                                        and result.parent_env == result.env_oid)):
        remember_env_oid(store, result.node, head, result.env_oid, result.env_mark)
    if tag and head:
        _tag(store, tag if nodes == 1 else f"{tag}-{result.node}", head, result)


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
    belongs to that snapshot (``load_stat_keys`` checks its commit) and
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
        if result.transport is None:
            result.transport = (starting and starting.take(spec.name)) or open_transport(spec).start()
        if first is not None:
            result.transport.info  # noqa: B018 - wait for the agent: is this node the first up?
            hash_on_node = not first.claim(spec.name)
        # Every file will be fetched when the node does not hash: have it stream them right
        # after its listing (the level first: finding it may take a request of its own).
        level = None if hash_on_node else _compress_level(result.transport)
        # Asked before the listing (so read before it): the agent answers it in the same
        # round trip, and no request of the listing's can come between.
        # Asked with the mark of the environment the last snapshot recorded: an unchanged one
        # is not read again (nor nvidia-smi run).
        known = remembered_env(store, spec.name, result.parent) if spec.environment else None
        environment = result.transport.request_environment_since(known[1] if known else "") \
            if spec.environment else None
        listing = result.transport.request_listing(None, cache_time, want_oids=hash_on_node, cache_keys=keys,
                                                   rows_if_unchanged=False)
        if level is not None:
            result.prefetch = result.transport.request_listed_files(level)
        _take_environment(result, environment, known)
        if keys is None:  # read the last snapshot while the node starts up and lists
            _read_parent(store, result)
            result.listing = listing()
        else:
            # Against stat keys, an unchanged tree (the usual re-pull) needs neither the last
            # snapshot's manifest nor the cache's rows: read them only if something changed
            # (client CPU the node's listing shares when both run on one machine).
            result.listing = listing()
            if not result.listing.rows_omitted:
                _read_parent(store, result)
        info = result.transport.info
        assert info is not None
        result.dist = info.dist_summary()
    except SnapverError as exc:
        result.error = exc


def _take_environment(result: NodePull, reply: Callable[[], Environment | None] | None,
                      known: tuple[str, str] | None) -> None:
    """The node's environment, or a note saying why there is none: never a failed pull.
    ``known``: the blob id and mark of the one the last snapshot recorded (the agent answers
    "same" to that mark)."""
    if reply is None:
        return
    try:
        environment = reply()
        if environment is None:
            assert known is not None
            result.env_oid = result.parent_env = known[0]
            result.env_mark = known[1]
            return
        result.environment = environment
        result.env_oid = blob_oid(environment.canonical())
        result.env_mark = environment.mark
    except TransportError as exc:
        if result.transport is None or not result.transport.is_open:
            raise
        result.env_note = f"environment not recorded: {exc.message}"


def _env_moved(store: Store, result: NodePull) -> bool:
    """True when the node's environment is not the one its last snapshot recorded. A last
    snapshot that recorded none (taken before environments were, or with `environment =
    false`) makes no snapshot of an unchanged tree: nothing is known to have moved."""
    if result.env_oid is None or result.parent is None:
        return False
    if result.parent_env is None:
        try:
            result.parent_env = recorded_env_oid(store, result.node, result.parent) or ""
        except StoreError:
            result.parent_env = ""
    return result.parent_env not in ("", result.env_oid)


def _with_rows(store: Store, result: NodePull) -> Manifest | None:
    """The last snapshot's manifest, and the listing's rows (a listing found as cached has
    none): for a snapshot of the same tree in another environment. None if unavailable."""
    listing = result.listing
    assert listing is not None
    if listing.rows_omitted:
        files = result.keys.read_cache() if result.keys is not None else None
        if files is None:
            return None
        result.listing = Listing(listing.now_ns, sorted(files.values(), key=BY_PATH), listing.hashed, as_cached=True)
    if result.parent_manifest is None:
        _read_parent(store, result)
    return result.parent_manifest


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
    up on the same client. A far link pays one more round trip."""
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
        manifest = _with_rows(store, result) if _env_moved(store, result) else None
        if manifest is None:
            result.unchanged_since = result.parent
            return None
        result.changed = 0
    else:
        key = tuple([(e.path, e.kind, e.mode, e.size, e.oid) for e in result.listing.entries])
        manifest = manifests.get(key)
        if manifest is None:
            manifest = manifests[key] = _manifest(store, result.listing.entries, digests, previous)
        result.changed = count_changes(previous, manifest) if previous is not None else len(manifest)
        if previous is not None and result.changed == 0 and not _env_moved(store, result):
            result.unchanged_since = result.parent
            return None
    result.env_changed = result.parent is not None and _env_moved(store, result)
    info = result.transport.info
    spec = result.transport.spec
    assert info is not None
    now = datetime.now(timezone.utc)
    meta = snapshot_meta(node=spec.name, host=spec.address, writer=writer_of(store), info=info, when=now,
                         paths=spec.paths, exclude=spec.exclude, manifest=manifest, changed=result.changed,
                         event=event, message=message, container=result.container, env=result.env_oid)
    subject = f"{spec.name}: {len(manifest)} files, {result.changed} changed ({info.dist_summary()})"
    if result.env_changed:
        subject += ", environment changed"
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
    extra, stored = _extra_files(result, record)
    return importer.commit(refs.node_ref(spec.name), result.parent, manifest,
                           format_message(subject, meta, message), now, extra_files=extra or None,
                           stored_files=stored or None, also_parents=also, ref_at=ref_at)


def _extra_files(result: NodePull, record: SnapshotRecord | None) -> tuple[dict[str, bytes], dict[str, str]]:
    """A snapshot's files beside its tree: by content, or by the id of a blob the store has
    (the environment its parent recorded, the same bytes)."""
    extra: dict[str, bytes] = {}
    stored: dict[str, str] = {}
    if record is not None and record.data is not None:
        extra[RECORD_PATH] = record.data
    elif record is not None and record.oid:
        stored[RECORD_PATH] = record.oid
    if result.env_oid is not None and result.parent_env == result.env_oid:
        stored[ENV_PATH] = result.env_oid  # the parent's blob (also when the node said "same")
    elif result.environment is not None and result.env_oid is not None:
        extra[ENV_PATH] = result.environment.canonical()
    return extra, stored


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
