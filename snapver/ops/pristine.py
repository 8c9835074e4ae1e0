"""Which files of a snapshot are pristine files of its distribution (listed in its RECORD).

A pull keeps, beside the manifest, the RECORD rows of the tracked paths of the
distribution the node has installed (``.snapver/record``). A rebase uses them to tell a
file the new release ships from one only left behind (pip removes what RECORD lists and
nothing else): a patch's added file is dropped only in favour of the former.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from snapver.errors import SnapverError
from snapver.model import Entry, is_git_id
from snapver.ops.record import tracked_record
from snapver.store.cache import RECORD_SOURCE_VERSION, of_version, record_source_path, write_atomic
from snapver.store.repo import Store
from snapver.transport.base import Transport

RECORD_PATH = ".snapver/record"


@dataclass
class SnapshotRecord:
    """A snapshot's RECORD rows (``.snapver/record``): their text, or the id of the same
    rows already in the store; and what they were made from (``source``: the node's
    RECORD files' sha256, the tracked paths and excludes), kept for the next pull."""

    source: dict[str, Any]
    data: bytes | None = None
    oid: str | None = None


def save_record_source(store: Store, node: str, commit: str, source: dict[str, Any]) -> None:
    """Keep what snapshot ``commit``'s RECORD rows were made from, for the node's next pull."""
    document = {"v": RECORD_SOURCE_VERSION, "commit": commit, **source}
    write_atomic(record_source_path(store, node), json.dumps(document).encode("ascii"))


def _source_of(store: Store, node: str, commit: str) -> dict[str, Any] | None:
    try:
        saved = json.loads(record_source_path(store, node).read_text())
        if not of_version(saved, RECORD_SOURCE_VERSION):
            return None
        del saved["v"]
        return saved if saved.pop("commit") == commit else None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def snapshot_record(store: Store, transport: Transport, parent: str | None,
                    made: dict[str, SnapshotRecord] | None = None) -> SnapshotRecord | None:
    """The node's RECORD rows for tracked paths, one ``algo hexdigest path`` line each,
    sorted; None when no installed distribution owns the tracked paths.

    The node first says its RECORD files' sha256 (cheap for the node) when that can spare
    reading them: rows another node of this pull sent from the same RECORDs (``made``, by
    source: a fleet installed from one wheel moves one RECORD, not one per node), or the
    rows of the ``parent`` snapshot, reused by id when made from the same RECORDs and
    tracked paths (a hot-fix's pull neither moves nor parses the RECORD). Rows made afresh
    are described by the sha256 of the bytes parsed, not of an earlier answer:
    a RECORD rewritten in between (pip at work) is never taken for
    the one parsed.
    """
    info, spec = transport.info, transport.spec
    assert info is not None
    paths = [f"{dist.dist_info}/RECORD" for dist in info.dists]
    if not paths:
        return None  # no dist-info (a source checkout, a folder): nothing to keep
    tracked = {"paths": list(spec.paths), "exclude": list(spec.exclude)}
    before = _source_of(store, spec.name, parent) if parent else None
    if before is not None or made is not None:
        try:
            digests = transport.hash_files(paths, "sha256")
        except SnapverError:
            digests = {}
        source = {"records": digests, **tracked}
        if digests and all(digests.values()):
            if source == before:
                try:
                    oid = store.git("rev-parse", "--verify", "--quiet", f"{parent}:{RECORD_PATH}").decode().strip()
                except SnapverError:
                    oid = ""
                if is_git_id(oid):
                    store.note_present([oid])  # in the tree of a snapshot a ref names
                    reused = SnapshotRecord(source, oid=oid)
                    if made is not None:
                        made[_key(source)] = reused
                    return reused
            if made is not None:
                shared = made.get(_key(source))
                if shared is not None:
                    return shared
    record = _read_record(transport, paths, tracked)
    if made is not None and record is not None:
        made[_key(record.source)] = record
    return record


def _key(source: dict[str, Any]) -> str:
    return json.dumps(source, sort_keys=True)


def _read_record(transport: Transport, paths: list[str], tracked: dict[str, Any]) -> SnapshotRecord | None:
    spec = transport.spec
    rows: dict[str, Any] = {}
    digests = {}
    try:
        for path, kind, data in transport.read_files(paths):
            digests[path] = hashlib.sha256(data).hexdigest() if kind is not None else None
            if kind is not None:
                rows.update(tracked_record(data, spec.paths, spec.exclude))
    except SnapverError:
        return None  # as a node without a readable RECORD: the snapshot keeps no rows
    if not any(digests.values()):
        return None
    lines = [f"{entry.algo} {entry.digest} {path}" for path, entry in sorted(rows.items())
             if entry.algo and entry.digest and "\n" not in path]
    data = ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape") if lines else b""
    return SnapshotRecord({"records": digests, **tracked}, data=data)


def recorded(store: Store, commit: str) -> dict[str, tuple[str, str]] | None:
    """``{path: (algo, hexdigest)}`` of a snapshot's RECORD rows; None if it kept none."""
    try:
        data = store.read_blob(f"{commit}:{RECORD_PATH}")
    except SnapverError:
        return None
    rows: dict[str, tuple[str, str]] = {}
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        algo, _, rest = line.partition(" ")
        digest, _, path = rest.partition(" ")
        if path:
            rows[path] = (algo, digest)
    return rows


def shipped(rows: dict[str, tuple[str, str]] | None, entry: Entry, data: bytes) -> bool | None:
    """True when ``entry`` (content ``data``) is a pristine file of the distribution: RECORD
    lists it with this hash. False: not listed (a leftover) or another hash. None: unknown."""
    if rows is None:
        return None
    row = rows.get(entry.path)
    if row is None or row[0] not in hashlib.algorithms_guaranteed:
        return False
    return hashlib.new(row[0], data).hexdigest() == row[1]
