"""A node's state as last seen: how its newest snapshot stood against the RECORD rows that
snapshot kept (``.snapver/record``), worked out from the store alone (the node may be down)."""

from __future__ import annotations

from dataclasses import dataclass

from snapver.model import ADDED, DELETED, MODIFIED, Manifest
from snapver.ops.pristine import recorded
from snapver.ops.record import ContentDigests, RecordEntry, compare_with_record, record_hashes
from snapver.store.repo import Store


@dataclass(frozen=True)
class SnapshotCheck:
    """A snapshot against its own RECORD rows: the distributions named, the paths that differ."""

    dists: str  # "sglang 0.5.23"
    manifest: Manifest
    differing: list[tuple[str, str]]  # (path, M/A/D), RECORD → snapshot


def snapshot_against_record(store: Store, commit: str, digests: ContentDigests) -> SnapshotCheck | None:
    """How snapshot ``commit`` stood against the RECORD rows it kept; None when it kept none.

    The digests of its blobs come from ``digests`` (learnt from the store where unknown):
    nothing is asked of the node.
    """
    rows = recorded(store, commit)
    if rows is None:
        return None
    manifest = store.manifest(commit)
    record = {path: RecordEntry(path, algo or None, digest or None, None) for path, (algo, digest) in rows.items()}
    oids = {entry.path: entry.oid for entry in manifest.entries.values()}
    for algo in {entry.algo for entry in record.values() if entry.algo}:
        known = digests.known(algo)
        digests.learn_from_store(algo, {entry.oid: entry.size for path, entry in manifest.entries.items()
                                        if path in record and entry.oid not in known})
    check = compare_with_record(record, oids, record_hashes(record, oids, digests, None))
    statuses = {**{p: MODIFIED for p in check.modified}, **{p: DELETED for p in check.missing},
                **{p: ADDED for p in check.extra}}
    meta_dists = store.commit(commit).meta.get("dists") or []
    name = ", ".join(" ".join(str(part) for part in dist[:2]) for dist in meta_dists if isinstance(dist, list))
    return SnapshotCheck(name or "RECORD", manifest, [(path, statuses[path]) for path in check.differing])
