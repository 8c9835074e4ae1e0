"""status: the fleet at a glance — per node, reachable?, newest snapshot, live drift, patches.

Every node is listed on the node itself (every file hashed, in parallel across nodes)
and compared with its newest snapshot. Each drifted file is then labelled: ``pristine``
(it equals what the wheel installed, per the distribution's RECORD), ``patch`` (it
equals what a patch in the store makes it; the patches are named) or ``hot-fix``
(neither: an unknown hand edit). Nothing is written anywhere.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from snapver.config import NodeSpec
from snapver.errors import RemotePathError, SnapverError, StoreError
from snapver.model import Change, Entry, Manifest, compare_manifests
from snapver.ops.diff import live_manifest
from snapver.ops.log import tags_by_commit
from snapver.ops.pull import request_live
from snapver.ops.verify import RecordEntry, hash_like_record, read_known_records
from snapver.store import refs
from snapver.store.repo import Store
from snapver.transport.base import Transport
from snapver.transport.connect import open_transport

PRISTINE, PATCH, HOTFIX = "pristine", "patch", "hot-fix"


@dataclass(frozen=True)
class KnownPatch:
    """A patch in the store and what it makes of each path it touches (None: deletes it)."""

    name: str
    commit: str
    changes: dict[str, Entry | None]


@dataclass(frozen=True)
class DriftedFile:
    """A path whose live state differs from the newest snapshot, and what the live state is."""

    path: str
    status: str  # M/A/D/T, snapshot → live
    label: str  # pristine | patch | hot-fix
    patches: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "status": self.status, "label": self.label, "patches": list(self.patches)}


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
    drift: list[DriftedFile] | None = None  # None: no snapshot to compare with
    patches: list[PatchState] = field(default_factory=list)
    record_missing: str = ""  # why pristine could not be checked, if it could not
    push: dict[str, Any] | None = None  # the newest push record (see last_push)
    error: SnapverError | None = None

    @property
    def drifted(self) -> bool:
        return bool(self.drift)

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return self.error.exit_code
        return 1 if self.drifted else 0

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "address": self.address, "reachable": self.reachable,
                "snapshot": self.snapshot,
                "snapshot_time": self.snapshot_time.isoformat() if self.snapshot_time else None,
                "tags": self.tags, "dist": self.dist, "files": self.files,
                "identical": None if self.drift is None else not self.drift,
                "drift": None if self.drift is None else [d.to_json() for d in self.drift],
                "patches": [p.to_json() for p in self.patches], "pristine_unchecked": self.record_missing or None,
                "push": self.push, "error": str(self.error) if self.error else None, "exit_code": self.exit_code}


@dataclass
class StatusResult:
    nodes: list[NodeStatus]

    @property
    def exit_code(self) -> int:
        return max((n.exit_code for n in self.nodes), default=0)


def status(store: Store | None, specs: list[NodeSpec], checksum: bool = False) -> StatusResult:
    """The status of every node in ``specs``, connected to in parallel.

    ``checksum`` hashes every live file instead of trusting stats unchanged since the last pull.
    """
    patches = known_patches(store) if store is not None else []
    tags = tags_by_commit(store) if store is not None else {}
    with ThreadPoolExecutor(max(1, min(32, len(specs)))) as pool:
        rows = list(pool.map(lambda spec: node_status(store, spec, patches, tags, checksum), specs))
    return StatusResult(rows)


def node_status(store: Store | None, spec: NodeSpec, patches: list[KnownPatch],
                tags: dict[str, list[str]], checksum: bool = False) -> NodeStatus:
    row = NodeStatus(spec.name, spec.address)
    try:
        with closing(open_transport(spec).start()) as transport:
            listing = request_live(store, transport, checksum)
            # The store is read while the node starts up and lists.
            snapshot_manifest = None
            if store is not None:
                row.snapshot = store.ref(refs.node_ref(spec.name))
                if row.snapshot:
                    row.snapshot_time = store.commit(row.snapshot).time.astimezone()
                    row.tags = sorted(tags.get(row.snapshot, []))
                    snapshot_manifest = store.manifest(row.snapshot)
                row.push = last_push(store, spec.name)
            assert transport.info is not None
            row.reachable = True
            row.dist = transport.info.dist_summary()
            live = live_manifest(listing())
            row.files = len(live)
            row.patches = patch_states(patches, live)
            if snapshot_manifest is not None:
                changes = compare_manifests(snapshot_manifest, live)
                row.drift = label_drift(transport, row, changes, patches) if changes else []
    except SnapverError as exc:
        row.error = exc
        # A missing or unreadable path is the node answering: it is reachable.
        row.reachable = row.reachable or isinstance(exc, RemotePathError)
    return row


def label_drift(transport: Transport, row: NodeStatus, changes: list[Change],
                patches: list[KnownPatch]) -> list[DriftedFile]:
    """Say of every drifted path whether its live state is pristine, a known patch, or a hot-fix."""
    record: dict[str, RecordEntry] | None = None
    try:
        record = read_known_records(transport)
    except SnapverError as exc:
        row.record_missing = exc.message
    pristine: set[str] = set()
    if record is not None:
        present = [record[c.path] for c in changes if c.new is not None and c.path in record]
        hashes = hash_like_record(transport, present)
        pristine = {e.path for e in present if hashes.get(e.path) == e.digest and e.digest}
        pristine |= {c.path for c in changes if c.new is None and c.path not in record}
    drifted = []
    for change in changes:
        names = tuple(p.name for p in patches if change.path in p.changes
                      and _same(p.changes[change.path], change.new))
        label = PRISTINE if change.path in pristine else PATCH if names else HOTFIX
        drifted.append(DriftedFile(change.path, change.status, label, names))
    return drifted


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


def known_patches(store: Store) -> list[KnownPatch]:
    """Every patch in the store (``refs/heads/patches/<name>``) as the paths it changes.

    A patch commit's tree is its base plus the patch; the base is ``meta["base"]`` if
    the commit records one, else its first parent.
    """
    found = []
    for name, commit_id in sorted(store.refs(refs.PATCHES).items()):
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
    from snapver.ops.plan import newest_record

    state = newest_record(store, node)
    return None if state is None else state.to_json()
