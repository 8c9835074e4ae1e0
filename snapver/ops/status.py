"""status: the fleet at a glance — per node, reachable?, newest snapshot, what changed since
it, and how the live tree stands against known-good code.

Known-good is, per node, the installed distribution's RECORD (what ``pip install``
wrote), or a ref the user names (``--against``). Every live file that is not as
known-good is ``patch NAME`` (it equals what a patch in the store makes it) or
``hot-fix`` (no known source) — whether or not a pull came after the edit. A node with
neither has no known-good code: its state is unknown (never pristine), and it says why.
Its newest snapshot is no stand-in: a pull records hot-fixes into it.

Every node is listed on the node itself (it re-hashes only files whose stat changed
since the last pull), in parallel. Its RECORD is compared by blob id: the RECORD
hashes of contents seen before are kept in the store (``ContentDigests``), so an
unchanged fleet is compared without reading its files again. Nothing else is written.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from snapver.config import Config, NodeSpec
from snapver.environment import Environment
from snapver.errors import RemotePathError, SnapverError, StoreError, UsageError
from snapver.model import ADDED, DELETED, FILE, MODIFIED, Change, DistInfo, Entry, Manifest, compare_manifests
from snapver.ops.envrecord import environment_or_none, group_outlier_notes
from snapver.ops.lastseen import snapshot_against_record
from snapver.ops.layer import recreated_note, request_identity
from snapver.ops.ledger import newest_record
from snapver.ops.live import request_live
from snapver.ops.log import tags_by_commit
from snapver.ops.ps import processes_of
from snapver.ops.record import (
    ContentDigests,
    RecordEntry,
    SharedRecords,
    compare_with_record,
    record_hashes,
    record_paths,
)
from snapver.ops.scope import Scope, commit_scope, node_scope, unrecorded_note, within_both
from snapver.ops.sourcetree import CommittedTree, compare_with_commit, fallback_note, from_checkout, request_head
from snapver.ops.trees import live_manifest, load_sides, normalize_paths, path_matches
from snapver.store import refs
from snapver.store.cache import RECORD_CHECK_VERSION, of_version, record_check_path, write_atomic
from snapver.store.repo import Store
from snapver.store.team import TeamView
from snapver.transport.base import Listing, Transport
from snapver.transport.connect import open_transport

PRISTINE, PATCH, HOTFIX = "pristine", "patch", "hot-fix"


@dataclass(frozen=True)
class KnownPatch:
    """A patch in the store and what it makes of each path it touches (None: deletes it)."""

    name: str
    commit: str
    changes: dict[str, Entry | None]


@dataclass(frozen=True)
class KnownGood:
    """What a node's live tree is held against: its RECORD, or the tree ``--against`` names."""

    kind: str  # "record" | "ref" | "git" (an editable install's checkout at HEAD)
    name: str  # "sglang 0.5.23", the ref as typed, or "git v0.5.23 (a1b2c3d)"
    commit: str | None = None
    manifest: Manifest | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        """How tables name it: ``RECORD sglang 0.5.23``, ``may22 (1a2b3c4d5e)``."""
        if self.kind == "record":
            return f"RECORD {self.name}"
        if self.kind == "git":
            return self.name
        return f"{self.name} ({self.commit[:10]})" if self.commit else self.name

    @property
    def pristine(self) -> str:
        """What a file that is as known-good is called in the fleet matrix's legend."""
        return f"pristine {self.name}" if self.kind in ("record", "git") else f"as {self.label}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "commit": self.commit}


@dataclass(frozen=True)
class DriftedFile:
    """A path whose live state differs from a reference tree, and what the live state is."""

    path: str
    status: str  # M/A/D/T, reference → live
    label: str  # pristine | patch | hot-fix
    patches: tuple[str, ...] = ()
    source: str = ""  # what makes it pristine when it differs from --against: "RECORD"

    def to_json(self) -> dict[str, Any]:
        found = {"path": self.path, "status": self.status, "label": self.label, "patches": list(self.patches)}
        return {**found, "source": self.source} if self.source else found


@dataclass(frozen=True)
class PatchState:
    """How much of a patch the live tree carries: ``matched`` of its ``total`` paths."""

    name: str
    matched: int
    total: int

    @property
    def applied(self) -> bool:
        return self.matched == self.total

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "matched": self.matched, "total": self.total, "applied": self.applied}


@dataclass
class NodeStatus:
    """One row of the status table."""

    node: str
    address: str
    reachable: bool = False
    snapshot: str | None = None
    snapshot_time: datetime | None = None
    tags: list[str] = field(default_factory=list)
    dist: str = ""
    files: int = 0
    drift: list[DriftedFile] | None = None  # since the newest snapshot; None: no snapshot
    known_good: KnownGood | None = None
    off: list[DriftedFile] | None = None  # files not as known-good; None: nothing to hold it against
    unchecked: str = ""  # why nothing is known-good (no RECORD, no --against), and how to name it
    patches: list[PatchState] = field(default_factory=list)
    push: dict[str, Any] | None = None  # the newest push record (see last_push)
    error: SnapverError | None = None
    restart_needed: int | None = None  # processes running older code (see ops/ps.py); None: not known
    restart_error: str | None = None  # why they could not be listed
    not_compared: list[str] = field(default_factory=list)  # notes: what the drift left out, and why
    notes: list[str] = field(default_factory=list)  # facts about the node beside its files (said under the table)
    left_out: int = 0  # files outside the snapshot's scope or the node's: the tree is not all the snapshot's
    container: dict[str, Any] | None = None  # the live container's ids, asked when its push record has some
    last_seen: bool = False  # down: known-good and state are its newest snapshot's, not the live tree's
    # working state, not reported
    live: Manifest | None = field(default=None, repr=False)
    transport: Transport | None = field(default=None, repr=False)
    record: dict[str, RecordEntry] | None = field(default=None, repr=False)
    record_differing: list[tuple[str, str]] | None = field(default=None, repr=False)  # from the cache
    committed: CommittedTree | None = field(default=None, repr=False)  # an editable install's git HEAD
    asked_container: Callable[[], dict[str, Any] | None] | None = field(default=None, repr=False)
    environment: Environment | None = field(default=None, repr=False)  # read with the listing (no GPU)

    @property
    def drifted(self) -> bool:
        return bool(self.drift)

    @property
    def hot_fixed(self) -> list[DriftedFile]:
        return [f for f in self.off or [] if f.label == HOTFIX]

    @property
    def patched(self) -> dict[str, int]:
        """``{patch name: files}`` of the files that are as a known patch makes them."""
        counts: dict[str, int] = {}
        for item in self.off or []:
            for name in item.patches if item.label == PATCH else ():
                counts[name] = counts.get(name, 0) + 1
        return counts

    @property
    def age_seconds(self) -> float | None:
        if self.snapshot_time is None:
            return None
        return max(0.0, (datetime.now(timezone.utc) - self.snapshot_time).total_seconds())

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return self.error.exit_code
        # Nothing known-good (off is None): whether the tree is pristine is not known, so not 0.
        return 1 if self.drifted or self.hot_fixed or self.off is None else 0

    def to_json(self) -> dict[str, Any]:
        off = self.off
        return {"node": self.node, "address": self.address, "reachable": self.reachable,
                "live": self.live is not None, "last_seen": self.last_seen, "snapshot": self.snapshot,
                "snapshot_time": self.snapshot_time.isoformat() if self.snapshot_time else None,
                "age_seconds": None if self.age_seconds is None else round(self.age_seconds),
                "tags": self.tags, "dist": self.dist, "files": self.files,
                "identical": None if self.drift is None else not self.drift,
                "since_snapshot": None if self.drift is None else len(self.drift),
                "drift": None if self.drift is None else [d.to_json() for d in self.drift],
                "known_good": {**self.known_good.to_json(),
                               "files": [f.to_json() for f in off or []],
                               "patched": sum(1 for f in off or [] if f.label == PATCH),
                               "patched_by": self.patched, "hot_fixed": len(self.hot_fixed)}
                if self.known_good is not None and off is not None else None,
                "pristine_unchecked": self.unchecked or None,
                "patches": [p.to_json() for p in self.patches],
                "push": self.push, "error": str(self.error) if self.error else None,
                "restart_needed": self.restart_needed, "restart_error": self.restart_error,
                "not_compared": self.not_compared, "notes": self.notes, "container": self.container,
                "exit_code": self.exit_code}


@dataclass
class StatusResult:
    nodes: list[NodeStatus]
    against: str | None = None

    @property
    def exit_code(self) -> int:
        return max((n.exit_code for n in self.nodes), default=0)


def status(store: Store | None, specs: list[NodeSpec], checksum: bool = False, config: Config | None = None,
           against: str | None = None) -> StatusResult:
    """The status of every node in ``specs``, connected to in parallel.

    ``checksum`` hashes every live file instead of trusting stats unchanged since the last pull.
    ``against`` (a ref, resolved with ``config``) replaces each node's RECORD as known-good.
    """
    reference = known_good_of(store, config, against) if against is not None else None
    view = TeamView(store) if store is not None else None  # every writer's, in a team store
    patches = known_patches(store, view) if store is not None else []
    tags = tags_by_commit(store, view) if store is not None else {}
    heads = view.merged(refs.NODES) if view is not None else {}
    digests = ContentDigests(store)
    rows = [NodeStatus(spec.name, spec.address) for spec in specs]
    with ThreadPoolExecutor(max(1, min(32, len(specs)))) as pool:
        try:
            records = SharedRecords()
            list(pool.map(lambda spec, row: _list_node(store, spec, row, tags, checksum, reference is None, records,
                                                                heads),
                          specs, rows))
            if store is not None:  # a down node: its newest snapshot, as last seen
                list(pool.map(lambda row: _judge_last_seen(store, row, patches, digests),
                              [row for row in rows if row.error is not None and not row.reachable and row.snapshot]))
            # RECORD hashes of the live blobs not seen before, from the store's copies:
            # once for the whole fleet (its nodes mostly hold the same files).
            for algo, oids in _unknown_blobs(rows, digests).items():
                digests.learn_from_store(algo, oids)
            list(pool.map(lambda row: _judge_node(row, reference, patches, digests, store), rows))
            list(pool.map(_note_recreated, rows))
            _note_group_outliers(rows, config)
        finally:
            list(pool.map(lambda t: t.close(), [r.transport for r in rows if r.transport is not None]))
    digests.save()
    return StatusResult(rows, against)


def _list_node(store: Store | None, spec: NodeSpec, row: NodeStatus, tags: dict[str, list[str]],
               checksum: bool, want_record: bool, records: SharedRecords, heads: dict[str, str]) -> None:
    """Connect, list, read the store meanwhile; then the RECORD, unless the node's tree is its
    snapshot's and how that snapshot stands against this RECORD is known already."""
    try:
        row.transport = open_transport(spec).start()
        # In the listing's round trip (no nvidia-smi): how the node's ground compares with its group's.
        asked = row.transport.request_environment(gpu=False) if spec.environment else None
        # heads: the newest snapshot of any writer's, as request_live would read them again per node.
        listing: Callable[[], Listing] = request_live(store, row.transport, checksum, heads.get(spec.name))
        # The store is read while the node starts up and lists.
        snapshot_manifest = None
        snapshot_scope = node_scope(spec)
        if store is not None:
            snapshot = _read_history(store, spec, row, tags, heads)
            if snapshot is not None:
                snapshot_manifest = store.manifest(snapshot.id)
                snapshot_scope = commit_scope(store, snapshot, node_scope(spec))
            if row.push and row.push.get("container"):  # asked of the engine while the node lists
                row.asked_container = request_identity(spec)
        info = row.transport.info
        assert info is not None
        # Behind the listing: the RECORDs' sha256, which says whether another node sends the same.
        # Read with --against too: a file that differs from the ref may still be as RECORD.
        record_digests = (row.transport.request("hash", paths=record_paths(info.dists), algo="sha256")
                          if info.dists else None)
        head = request_head(row.transport) if want_record and from_checkout(info) else None
        row.reachable = True
        row.dist = info.dist_summary()
        row.environment = environment_or_none(asked, row.transport)
        row.live = live_manifest(listing())
        row.files = len(row.live)
        digests = record_digests()["hashes"] if record_digests is not None else None
        committed = head() if head is not None else None  # read in turn: replies come in order
        _count_restarts(row.transport, spec, row, store)
        if snapshot_manifest is not None:
            row.drift = [
                DriftedFile(c.path, c.status, "") for c in _drift(row, spec, snapshot_manifest, snapshot_scope)
            ]
        if isinstance(committed, CommittedTree):
            row.committed = committed
            return
        if committed:
            row.notes.append(fallback_note(committed))
        if digests is None:
            if want_record:
                row.unchecked = _nothing_known_good(f"no installed distribution (*.dist-info) owns "
                                                    f"{', '.join(spec.paths)} in {info.site_packages}")
            return
        if store is not None and row.snapshot and row.drift == [] and not row.left_out and not checksum:
            row.record_differing = load_record_check(store, spec, row.snapshot, info.dists)
        if row.record_differing is None:
            try:
                row.record = records.get(row.transport, digests)
            except RemotePathError as exc:  # no RECORD file
                if want_record:
                    row.unchecked = _nothing_known_good(exc.message.removeprefix(f"{spec.name}: "))
    except SnapverError as exc:
        row.error = exc
        # A missing or unreadable path is the node answering: it is reachable.
        row.reachable = row.reachable or isinstance(exc, RemotePathError)
        row.live = None
        if store is not None and row.snapshot is None and not row.reachable:
            try:
                _read_history(store, spec, row, tags, heads)
            except SnapverError:
                pass  # the node's error is what the row says


def _read_history(store: Store, spec: NodeSpec, row: NodeStatus, tags: dict[str, list[str]],
                  heads: dict[str, str]) -> Any:
    """The row's newest snapshot, its time and tags, and the node's last push; the snapshot's commit."""
    row.snapshot = heads.get(spec.name)
    row.push = last_push(store, spec.name)
    if not row.snapshot:
        return None
    snapshot = store.commit(row.snapshot)
    row.snapshot_time = snapshot.time
    row.tags = sorted(tags.get(row.snapshot, []))
    return snapshot


def _judge_last_seen(store: Store, row: NodeStatus, patches: list[KnownPatch], digests: ContentDigests) -> None:
    """A down node's known-good state as its newest snapshot held it (from the store alone)."""
    assert row.snapshot is not None
    try:
        check = snapshot_against_record(store, row.snapshot, digests)
    except SnapverError:
        return  # the node's own error is the row's story
    row.last_seen = True
    if check is None:
        return
    row.known_good = KnownGood("record", check.dists)
    row.off = [_labelled(path, status, check.manifest.get(path), patches) for path, status in check.differing]


def _note_recreated(row: NodeStatus) -> None:
    """A note when the node's container is not the one its newest push wrote into."""
    if row.asked_container is None:
        return
    row.container = row.asked_container()
    if row.live is not None:  # the files read: whether they hold the patch is known
        note = recreated_note(row.container, row.push, [p.name for p in row.patches if p.applied])
        if note:
            row.notes.append(note)


def _note_group_outliers(rows: list[NodeStatus], config: Config | None) -> None:
    """A node whose distributions are not what most of its group has gets a note each."""
    environments = {row.node: row.environment for row in rows if row.environment is not None}
    for node, notes in group_outlier_notes(environments, config.groups if config else {}).items():
        next(row for row in rows if row.node == node).notes.extend(notes)


def _drift(row: NodeStatus, spec: NodeSpec, snapshot: Manifest, scope: Scope) -> list[Change]:
    """The live tree's changes since the snapshot, over the paths both observed; what either
    side's scope left out goes to ``row.not_compared``."""
    assert row.live is not None
    label = f"{spec.name}@latest ({(row.snapshot or '')[:10]})"
    taken, live, left = within_both(snapshot, row.live, scope, node_scope(spec), f"when {label} was taken",
                                    f"by {spec.name}'s config now")
    row.not_compared = ([unrecorded_note(label, scope)] if not scope.recorded else []) + \
        [out.note("not compared") for out in left]
    row.left_out = sum(len(out.paths) for out in left)
    return compare_manifests(taken, live)


def _nothing_known_good(why: str) -> str:
    """The note of a node whose tree nothing is known-good for, and how to give it some."""
    return (f"{why}: no known-good code, so whether its tree is pristine is unknown; name one with "
            "--against REF (a tag, a snapshot, a folder), or keep the distribution's *.dist-info RECORD on the node")


def _count_restarts(transport: Transport, spec: NodeSpec, row: NodeStatus, store: Store | None) -> None:
    """How many of the node's processes run code older than its tree (the restart column);
    a node whose processes cannot be listed says why and keeps its status."""
    try:
        found = processes_of(transport, spec, store)
    except SnapverError as exc:
        row.restart_error = exc.message
        return
    row.restart_needed = len(found.needing_restart)
    if found.hidepid and not row.restart_needed:
        # Other users' processes (the server's, often) are hidden: 0 would claim too much.
        row.restart_needed = None
        row.restart_error = (f"/proc is mounted with {found.hidepid}: processes of other users are hidden from "
                             "the SSH user")


def _unknown_blobs(rows: list[NodeStatus], digests: ContentDigests) -> dict[str, dict[str, int]]:
    """``{algo: {blob id: size}}`` of live RECORD paths whose RECORD hash is not known yet."""
    wanted: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.record is None or row.live is None:
            continue
        live = row.live.entries
        known: dict[str, dict[str, str]] = {}
        for path, entry in row.record.items():
            found = live.get(path)
            if found is None or not entry.digest or not entry.algo:
                continue
            if entry.algo not in known:
                known[entry.algo] = digests.known(entry.algo)
            if found.oid not in known[entry.algo]:
                wanted.setdefault(entry.algo, {})[found.oid] = found.size
    return wanted


def _judge_node(row: NodeStatus, reference: KnownGood | None, patches: list[KnownPatch],
                digests: ContentDigests, store: Store | None = None) -> None:
    """Hold the live tree against known-good; label what differs, and the drift since the snapshot."""
    if row.live is None:
        return
    try:
        row.patches = patch_states(patches, row.live)
        differing: list[tuple[str, str]] | None = None
        # Kept only by a status held against the RECORD (as before --against read it too).
        against_record = _against_record(row, digests, store if reference is None else None)
        if reference is None and row.committed is not None:
            row.known_good = KnownGood("git", row.committed.label, row.committed.commit)
            differing = compare_with_commit(row.committed, row.live)
        elif reference is None and against_record is not None:
            assert row.transport is not None and row.transport.info is not None
            dists = row.transport.info.dists
            row.known_good = KnownGood("record", ", ".join(f"{d.name} {d.version}" for d in dists) or "RECORD")
            differing = against_record
        elif reference is not None and reference.manifest is not None:
            row.known_good = reference
            differing = [(c.path, c.status) for c in compare_manifests(reference.manifest, row.live)]
        if differing is not None:
            # Against a ref, a file that differs from it but is as RECORD is pristine, not a hot-fix.
            as_record = None if reference is None or against_record is None else {p for p, _ in against_record}
            row.off = [_labelled(path, status, row.live.get(path), patches, as_record) for path, status in differing]
        if row.drift is not None:
            # Each change since the snapshot, labelled by what its live state is.
            off = {item.path: item for item in row.off or []}
            pristine = PRISTINE if row.off is not None else ""
            row.drift = [DriftedFile(d.path, d.status, off[d.path].label, off[d.path].patches) if d.path in off
                         else DriftedFile(d.path, d.status, pristine) for d in row.drift]
    except SnapverError as exc:
        row.error = exc


def _against_record(row: NodeStatus, digests: ContentDigests, store: Store | None) -> list[tuple[str, str]] | None:
    """The live paths not as the node's RECORD (with M/A/D), from the cache or checked now;
    None when the node has no RECORD."""
    if row.record_differing is not None:
        return row.record_differing
    if row.record is None:
        return None
    assert row.live is not None and row.transport is not None and row.transport.info is not None
    live_oids = {e.path: e.oid for e in row.live.entries.values()}
    check = compare_with_record(row.record, live_oids, record_hashes(row.record, live_oids, digests, row.transport))
    statuses = {**{p: MODIFIED for p in check.modified}, **{p: DELETED for p in check.missing},
                **{p: ADDED for p in check.extra}}
    differing = [(path, statuses[path]) for path in check.differing]
    if store is not None and row.snapshot and row.drift == [] and not row.left_out:
        save_record_check(store, row.transport.spec, row.snapshot, row.transport.info.dists, differing)
    return differing


def _record_check_key(spec: NodeSpec, snapshot: str, dists: Sequence[DistInfo]) -> dict[str, Any]:
    return {"snapshot": snapshot, "dists": [[d.name, d.version, d.dist_info] for d in dists],
            "paths": list(spec.paths), "exclude": list(spec.exclude)}


def load_record_check(store: Store, spec: NodeSpec, snapshot: str,
                      dists: Sequence[DistInfo]) -> list[tuple[str, str]] | None:
    """How the node's snapshot stood against its RECORD (paths that differ, with M/A/D), if a
    status worked it out before for this snapshot and these distributions; else None.

    Valid while the live tree is that snapshot: pip writes RECORD with the files, so the
    same files under the same dist-info mean the same RECORD (``verify`` reads it afresh).
    """
    try:
        data = json.loads(record_check_path(store, spec.name).read_text())
        if not of_version(data, RECORD_CHECK_VERSION) or data.get("key") != _record_check_key(spec, snapshot, dists):
            return None
        return [(str(path), str(status)) for path, status in data["differing"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # a cache: without it the RECORD is read


def save_record_check(store: Store, spec: NodeSpec, snapshot: str, dists: Sequence[DistInfo],
                      differing: list[tuple[str, str]]) -> None:
    """Keep what ``load_record_check`` reads (best effort, written whole then renamed)."""
    document = {"v": RECORD_CHECK_VERSION, "key": _record_check_key(spec, snapshot, dists), "differing": differing}
    try:
        write_atomic(record_check_path(store, spec.name), json.dumps(document).encode("ascii"))
    except OSError:
        pass


def _labelled(path: str, status: str, live: Entry | None, patches: list[KnownPatch],
              not_as_record: set[str] | None = None) -> DriftedFile:
    """A file not as known-good, by its known source: a patch, else the RECORD (when held
    against a ref: ``not_as_record`` the paths not as RECORD), else none (a hot-fix)."""
    names = tuple(p.name for p in patches if path in p.changes and _same(p.changes[path], live))
    if names:
        return DriftedFile(path, status, PATCH, names)
    if not_as_record is not None and path not in not_as_record:
        return DriftedFile(path, status, PRISTINE, source="RECORD")
    return DriftedFile(path, status, HOTFIX)


def known_good_of(store: Store | None, config: Config | None, text: str) -> KnownGood:
    """The tree ``--against REF`` names (resolved as `diff` resolves its operands)."""
    from snapver.refs import Resolver

    if config is None:
        raise UsageError("--against needs the config to resolve its ref")
    tree = Resolver(store, config).tree(text)
    if tree.live_node is not None:  # a folder is a live tree too, and a fine known-good copy
        raise UsageError(f"--against {text}: a live node is not known-good code",
                         hint=f"name a snapshot, a tag or a folder, e.g. {tree.live_node}@latest")
    # As diff loads its sides: whatever tree a ref can name (a snapshot, a patch, a folder) loads here too.
    side = load_sides(store, config, [tree])[0]
    if side.transport is not None:
        side.transport.close()
    return KnownGood("ref", text, side.commit.id if side.commit else None, side.manifest)


def patch_states(patches: list[KnownPatch], live: Manifest) -> list[PatchState]:
    """Patches the live tree carries, wholly or in part (a content match, not only deletions)."""
    states = []
    for patch in patches:
        matched = [path for path, entry in patch.changes.items() if _same(entry, live.get(path))]
        if patch.changes and (len(matched) == len(patch.changes)
                              or any(patch.changes[path] is not None for path in matched)):
            states.append(PatchState(patch.name, len(matched), len(patch.changes)))
    return states


def _same(wanted: Entry | None, live: Entry | None) -> bool:
    if wanted is None or live is None:
        return wanted is live
    return wanted.kind == live.kind and wanted.oid == live.oid


def known_patches(store: Store, view: TeamView | None = None) -> list[KnownPatch]:
    """Every patch in the store (``refs/heads/patches/<name>``) as the paths it changes.

    A patch commit's tree is its base plus the patch; the base is ``meta["base"]`` if
    the commit records one, else its first parent.
    """
    found = []
    for name, commit_id in sorted((view or TeamView(store)).merged(refs.PATCHES).items()):
        try:
            commit = store.commit(commit_id)
            base_ref = commit.meta.get("base")
            base = store.ref(str(base_ref)) if base_ref else None
            base = base or (commit.parents[0] if commit.parents else None)
            base_manifest = store.manifest(base) if base else Manifest()
            changes = compare_manifests(base_manifest, store.manifest(commit_id))
        except StoreError:
            continue  # not a patch snapver can read; fsck reports it
        found.append(KnownPatch(name, commit_id, {c.path: c.new for c in changes}))
    return found


def last_push(store: Store, node: str) -> dict[str, Any] | None:
    """The node's newest push record (patch, action, state, ``interrupted``), or None."""
    state = newest_record(store, node)
    return None if state is None else state.to_json()


# -- the fleet matrix -------------------------------------------------------------------------

ABSENT = "-"
UNKNOWN = "?"


@dataclass(frozen=True)
class LegendItem:
    """One letter of a matrix row: what that content is, its blob id and its mode (``st_mode``).

    ``show_mode``: the row's contents differ in mode or kind (a file and a link to the same
    bytes; 644 and 755), so the mode is what tells this letter from another.
    """

    letter: str
    what: str
    oid: str
    mode: int
    show_mode: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"is": self.what, "oid": self.oid or None, "mode": f"{self.mode:o}"}


@dataclass(frozen=True)
class MatrixRow:
    """One file across the fleet: a letter per node (``-`` absent, ``?`` node not read), and
    what each letter's content is."""

    path: str
    letters: tuple[str, ...]
    legend: tuple[LegendItem, ...]

    @property
    def agrees(self) -> bool | None:
        """Whether every node holds the same; None: the nodes read do, but a node was not read."""
        read = set(self.letters) - {UNKNOWN}
        if len(read) > 1:
            return False
        return None if UNKNOWN in self.letters else True

    def to_json(self, nodes: Sequence[str]) -> dict[str, Any]:
        return {"path": self.path, "agrees": self.agrees, "nodes": dict(zip(nodes, self.letters, strict=False)),
                "legend": {item.letter: item.to_json() for item in self.legend}}


@dataclass
class MatrixResult:
    """The fleet matrix (``status --files``): rows of files, a column per node."""

    status: StatusResult
    rows: list[MatrixRow]
    paths: tuple[str, ...] = ()

    @property
    def nodes(self) -> list[str]:
        return [row.node for row in self.status.nodes]

    @property
    def compared(self) -> list[str]:
        """The nodes whose trees were read: the matrix says nothing of the others."""
        return [row.node for row in self.status.nodes if row.live is not None]

    @property
    def not_compared(self) -> list[str]:
        return [row.node for row in self.status.nodes if row.live is None]

    @property
    def exit_code(self) -> int:
        errors = max((n.error.exit_code for n in self.status.nodes if n.error is not None), default=0)
        return errors or (1 if any(row.agrees is False for row in self.rows) else 0)

    def to_json(self) -> dict[str, Any]:
        nodes = self.nodes
        return {"nodes": nodes, "compared": self.compared, "not_compared": self.not_compared,
                "paths": list(self.paths),
                "known_good": {n.node: n.known_good.to_json() if n.known_good else None for n in self.status.nodes},
                "errors": {n.node: str(n.error) for n in self.status.nodes if n.error is not None},
                "files": [row.to_json(nodes) for row in self.rows], "exit_code": self.exit_code}


def _content(entry: Entry) -> tuple[str, str, int]:
    """What makes two copies of a file the same for the matrix, as for `diff`: kind, blob id,
    and a file's permission bits (same bytes, another mode: `diff` says T)."""
    return entry.kind, entry.oid, stat.S_IMODE(entry.mode) if entry.kind == FILE else 0


def fleet_matrix(result: StatusResult, paths: Sequence[str] = ()) -> MatrixResult:
    """One row per file that is not the same on every node read (with ``paths``: per file
    they name, whether or not it agrees), each node's content as a letter.

    Letters go to contents (kind, blob id and mode) in node order (``A`` the first node's);
    the legend says what each is: pristine (as known-good), a patch, a hot-fix (neither),
    or only its blob id where nothing is known-good for the nodes that hold it.
    """
    filters = normalize_paths(paths)
    rows_read = [n for n in result.nodes if n.live is not None]
    every = sorted({path for n in rows_read for path in n.live.entries})  # type: ignore[union-attr]
    if filters:
        for pattern in filters:
            if not any(path_matches(path, [pattern]) for path in every):
                raise UsageError(f"path {pattern!r} matches no file on {', '.join(n.node for n in rows_read)}",
                                 hint="paths are relative to site-packages, e.g. sglang/srt/server_args.py")
        every = [path for path in every if path_matches(path, filters)]
    off = {n.node: {item.path: item for item in n.off or []} for n in rows_read}
    rows = []
    for path in every:
        states = [(n, n.live.get(path)) for n in rows_read]  # type: ignore[union-attr]
        contents = {_content(e) if e is not None else None for _n, e in states}
        if not filters and len(contents) == 1:
            continue
        # Contents that differ in kind or mode: the legend gives each one's (it may be all that differs).
        show_mode = len({(key[0], key[2]) for key in contents if key is not None}) > 1
        letters: dict[Any, str] = {}
        legend: list[LegendItem] = []
        for _node, entry in states:
            if entry is None:
                continue
            key = _content(entry)
            if key in letters:
                continue
            letter = letters[key] = chr(ord("A") + len(letters)) if len(letters) < 26 else "*"
            legend.append(LegendItem(letter, _what(path, key, states, off), entry.oid, entry.mode, show_mode))
        by_node = {n.node: (letters[_content(e)] if e is not None else ABSENT) for n, e in states}
        rows.append(MatrixRow(path, tuple(by_node.get(n.node, UNKNOWN) for n in result.nodes), tuple(legend)))
    return MatrixResult(result, rows, tuple(filters))


def _what(path: str, key: tuple[str, str, int], states: list[tuple[NodeStatus, Entry | None]],
          off: dict[str, dict[str, DriftedFile]]) -> str:
    """What the content ``key`` at ``path`` is, by the nodes that hold it."""
    holders = [n for n, e in states if e is not None and _content(e) == key]
    for node in holders:  # as known-good on one of them
        if node.known_good is not None and node.off is not None and path not in off[node.node]:
            return node.known_good.pristine
    for node in holders:
        item = off[node.node].get(path)
        if item is not None and item.label == PATCH:
            return "patch " + ", ".join(item.patches)
    if any(node.known_good is not None and node.off is not None for node in holders):
        return HOTFIX
    return ""  # nothing known-good: only its blob id says what it is
