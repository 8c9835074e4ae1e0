"""A distribution's RECORD: which installed distributions own the tracked paths, their
RECORD rows (parsed once per content), a tree checked against them, and RECORD-style
digests of contents kept by blob id.

Shared by verify (live files against RECORD), status (known-good) and the snapshot
engine (the RECORD rows a snapshot keeps, ``ops/pristine.py``).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import posixpath
import re
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapver.errors import RemotePathError
from snapver.model import DistInfo, is_safe_relpath
from snapver.ops.scope import tracked_filter
from snapver.store.cache import digests_path
from snapver.store.repo import Store
from snapver.transport.base import Transport


@dataclass(frozen=True)
class RecordEntry:
    """One RECORD row for a tracked path: its hash (hex) if RECORD gives one."""

    path: str
    algo: str | None
    digest: str | None
    size: int | None


@dataclass
class RecordCheck:
    """A tree against a RECORD: what differs (paths sorted), and how many files were checked."""

    checked: int = 0
    modified: list[str] = field(default_factory=list)  # content differs from RECORD's hash
    missing: list[str] = field(default_factory=list)  # RECORD lists it, the tree lacks it
    extra: list[str] = field(default_factory=list)  # the tree has it, RECORD does not list it
    unverifiable: list[str] = field(default_factory=list)  # RECORD lists it without a usable hash

    @property
    def differing(self) -> list[str]:
        """Every path whose state is not what RECORD says."""
        return sorted(self.modified + self.missing + self.extra)


def compare_with_record(record: dict[str, RecordEntry], live: Collection[str],
                        hashes: Mapping[str, str | None]) -> RecordCheck:
    """Compare a tree (its paths, and each RECORD path's hash in RECORD's algorithm) with RECORD.

    ``hashes`` may come from the node (``hash_like_record``) or from a cache by content;
    a hashed path with no answer counts as missing (it vanished while hashed).
    """
    check = RecordCheck()
    for path, entry in sorted(record.items()):
        if path not in live:
            check.missing.append(path)
        elif entry.digest is None or entry.algo not in hashlib.algorithms_guaranteed:
            check.unverifiable.append(path)
        elif hashes.get(path) is None:
            check.missing.append(path)  # gone while hashed
        else:
            check.checked += 1
            if hashes[path] != entry.digest:
                check.modified.append(path)
    check.extra = sorted(path for path in live if path not in record)
    return check


def read_record(transport: Transport) -> tuple[dict[str, RecordEntry], list[DistInfo]]:
    """The RECORD rows of the distributions owning the tracked paths, for tracked paths only."""
    return request_record(transport)()


def owning_dists(transport: Transport) -> list[DistInfo]:
    """The installed distributions (``*.dist-info``) owning the tracked paths; none is a
    RemotePathError (verify needs the RECORD pip wrote)."""
    info = transport.info
    assert info is not None
    if not info.dists:
        spec = transport.spec
        raise RemotePathError(f"{spec.name}: no installed distribution (*.dist-info) owns "
                              f"{', '.join(spec.paths)} in {info.site_packages}",
                              hint="verify needs the RECORD that pip wrote when it installed the package")
    return list(info.dists)


def request_record(transport: Transport) -> Callable[[], tuple[dict[str, RecordEntry], list[DistInfo]]]:
    """``read_record`` in two steps: ask the node now (behind any request already sent),
    and get a function that reads the answer. RemotePathError at once if no installed
    distribution owns the tracked paths, from the function if none has a RECORD."""
    spec = transport.spec
    dists = owning_dists(transport)
    stream = transport.read_files([f"{d.dist_info}/RECORD" for d in dists])

    def finish() -> tuple[dict[str, RecordEntry], list[DistInfo]]:
        record: dict[str, RecordEntry] = {}
        found = False
        for _path, kind, data in stream:
            if kind is None:
                continue
            found = True
            record.update(tracked_record(data, spec.paths, spec.exclude))
        if not found:
            raise RemotePathError(f"{spec.name}: {', '.join(d.dist_info for d in dists)} has no RECORD file")
        return record, dists

    return finish


_VERSION_LINE = re.compile(rb"""^\s*__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", re.M)


def importable_versions(transport: Transport, tops: list[str]) -> dict[str, str]:
    """``{top package: version}`` as its ``version.py`` / ``_version.py`` / ``__init__.py``
    states ``__version__`` (what Python imports), for the packages that state one."""
    wanted = [f"{top}/{name}" for top in tops for name in ("version.py", "_version.py", "__init__.py")]
    found: dict[str, str] = {}
    for path, kind, data in transport.read_files(wanted):
        top = path.split("/")[0]
        match = _VERSION_LINE.search(data) if kind is not None and data else None
        if match and top not in found:
            found[top] = match.group(1).decode("utf-8", "replace")
    return found


def _installed(transport: Transport, dists: list[DistInfo]) -> tuple[list[DistInfo], list[DistInfo]]:
    """Split dist-infos into (installed, leftovers): of several with one name, the installed
    one is the version the package itself states; when none says, all count."""
    by_name: dict[str, list[DistInfo]] = {}
    for dist in dists:
        by_name.setdefault(re.sub(r"[-_.]+", "-", dist.name).lower(), []).append(dist)
    if all(len(group) == 1 for group in by_name.values()):
        return dists, []
    tops = sorted({path.split("/")[0] for path in transport.spec.paths})
    versions = set(importable_versions(transport, tops).values())
    installed, leftovers = [], []
    for group in by_name.values():
        current = [d for d in group if d.version in versions] if len(group) > 1 else group
        if len(current) != 1:
            current = group  # cannot tell: check against all of them
        installed += current
        leftovers += [d for d in group if d not in current]
    return installed, leftovers


def read_records(transport: Transport) -> tuple[dict[str, RecordEntry], list[DistInfo], list[DistInfo],
                                                 dict[str, RecordEntry]]:
    """The RECORD rows (tracked paths only) of the installed distributions owning the
    tracked paths, those distributions, the leftover dist-infos and their rows."""
    spec = transport.spec
    dists = owning_dists(transport)
    dists, leftovers = _installed(transport, dists)
    leftover_names = {f"{d.dist_info}/RECORD" for d in leftovers}
    record: dict[str, RecordEntry] = {}
    leftover_record: dict[str, RecordEntry] = {}
    found = False
    for path, kind, data in transport.read_files([f"{d.dist_info}/RECORD" for d in dists + leftovers]):
        if kind is None:
            continue
        found = found or path not in leftover_names
        for entry in parse_record(data, tracked_filter(tuple(spec.paths), tuple(spec.exclude))):
            (leftover_record if path in leftover_names else record)[entry.path] = entry
    if not found:
        raise RemotePathError(f"{spec.name}: {', '.join(d.dist_info for d in dists)} has no RECORD file")
    return record, dists, leftovers, leftover_record


def record_paths(info_dists: Sequence[DistInfo]) -> list[str]:
    """The RECORD files of the distributions (relative to site-packages)."""
    return [f"{d.dist_info}/RECORD" for d in info_dists]


class SharedRecords:
    """The RECORDs of one command's nodes, each content read from one node only.

    A node first says its RECORDs' sha256 (cheap for the node); a node whose RECORDs
    another node already sent, or is sending, gets that parse. A fleet installed from one
    wheel moves and parses one RECORD, not one per node, all held at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._locks: dict[Any, threading.Lock] = {}
        self._found: dict[Any, dict[str, RecordEntry]] = {}

    def get(self, transport: Transport, digests: Mapping[str, str | None]) -> dict[str, RecordEntry]:
        """The node's tracked RECORD rows, given ``digests``: its RECORD files' sha256 (None: absent)."""
        spec = transport.spec
        if not any(digests.values()):
            assert transport.info is not None
            raise RemotePathError(f"{spec.name}: {', '.join(d.dist_info for d in transport.info.dists)} "
                                  "has no RECORD file")
        key = (tuple(sorted(digests.items())), spec.paths, spec.exclude)
        with self._lock:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:  # the first node with these RECORDs reads them; the others wait for its parse
            found = self._found.get(key)
            if found is None:
                found = self._found[key] = read_record(transport)[0]
        return found


_parsed: dict[tuple[bytes, tuple[str, ...], tuple[str, ...]], dict[str, RecordEntry]] = {}
_parsed_lock = threading.Lock()


def tracked_record(data: bytes, tracked: tuple[str, ...], exclude: tuple[str, ...]) -> dict[str, RecordEntry]:
    """A RECORD's rows for tracked paths. Parsed once per content: the nodes of a fleet
    send the same RECORD."""
    key = (data, tuple(tracked), tuple(exclude))
    # Parsed under the lock: 16 nodes sending one RECORD at once would otherwise parse it
    # 16 times over, at once (each parse holds all its rows while it runs).
    with _parsed_lock:
        found = _parsed.get(key)
        if found is None:
            keep = tracked_filter(tuple(tracked), tuple(exclude))
            found = {entry.path: entry for entry in parse_record(data, keep)}
            if len(_parsed) >= 8:
                _parsed.clear()
            _parsed[key] = found
    return found


def parse_record(data: bytes, keep: Callable[[str], bool] | None = None) -> list[RecordEntry]:
    """RECORD (CSV: path, ``algo=urlsafe-base64``, size) → entries with hex digests; only
    the rows whose path ``keep`` accepts (decoding a digest costs more than the test)."""
    entries = []
    text = data.decode("utf-8", "surrogateescape")
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        path = row[0]
        if not is_safe_relpath(path):  # a safe path is already normal: normpath only the others
            path = posixpath.normpath(path)
            if not is_safe_relpath(path):
                continue  # e.g. ../../bin/sglang: outside site-packages, never tracked
        if keep is not None and not keep(path):
            continue
        algo = digest = None
        if len(row) > 1 and "=" in row[1]:
            algo, _, encoded = row[1].partition("=")
            try:
                digest = base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4)).hex()
            except (ValueError, TypeError):
                algo = digest = None
        size = int(row[2]) if len(row) > 2 and row[2].isdigit() else None
        entries.append(RecordEntry(path, algo, digest, size))
    return entries


def hash_like_record(transport: Transport, entries: list[RecordEntry]) -> dict[str, str | None]:
    """Hash each entry's live file on the node with the algorithm its RECORD row names."""
    by_algo: dict[str, list[str]] = {}
    for entry in entries:
        if entry.algo is not None and entry.algo in hashlib.algorithms_guaranteed and entry.digest:
            by_algo.setdefault(entry.algo, []).append(entry.path)
    hashes: dict[str, str | None] = {}
    for algo, paths in by_algo.items():
        hashes.update(transport.hash_files(paths, algo))
    return hashes


WHOLE_BLOB_LIMIT = 1 << 20  # larger blobs are hashed in pieces (client memory stays bounded)


class ContentDigests:
    """RECORD-style digests (sha256, …) of file contents by git blob id, kept in the store.

    A content's digest never changes, so what one status learnt answers every later one:
    a node's tree is compared with its RECORD by looking up the blob ids its listing
    already gives (the node re-hashes only what changed, by stat), not by reading every
    file again. Only digests of content read from the store are kept: a digest computed
    on a node might belong to a file rewritten after it was listed.
    """

    def __init__(self, store: Store | None) -> None:
        self.store = store
        self._known: dict[str, dict[str, str]] = {}
        self._fresh: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def _file(self, algo: str) -> Path | None:
        return digests_path(self.store, algo) if self.store is not None else None

    def known(self, algo: str) -> dict[str, str]:
        """``{blob id: digest}`` learnt so far for ``algo`` (read from the store once)."""
        with self._lock:
            found = self._known.get(algo)
            if found is None:
                found = self._known[algo] = {}
                path = self._file(algo)
                try:
                    text = path.read_text(encoding="ascii") if path is not None else ""
                except (OSError, UnicodeDecodeError):
                    text = ""  # a cache: without it everything is hashed again
                for line in text.splitlines():
                    oid, _, digest = line.partition(" ")
                    if len(oid) == 40 and digest:
                        found[oid] = digest
            return found

    def learn_from_store(self, algo: str, sizes: Mapping[str, int]) -> None:
        """Hash, from the store, those blobs of ``sizes`` (blob id: size) it holds whose digest
        is not known; small ones through one git process, large ones in pieces."""
        if self.store is None or algo not in hashlib.algorithms_guaranteed:
            return
        known = self.known(algo)
        wanted = self.store.existing(oid for oid in sizes if oid not in known)
        if not wanted:
            return
        small = sorted(oid for oid in wanted if sizes[oid] <= WHOLE_BLOB_LIMIT)
        learnt = {oid: hashlib.new(algo, data).hexdigest() for oid, data in self.store.read_blobs(small)}
        for oid in sorted(wanted - set(small)):
            digest = hashlib.new(algo)
            for piece in self.store.blob_chunks(oid):
                digest.update(piece)
            learnt[oid] = digest.hexdigest()
        with self._lock:
            known.update(learnt)
            self._fresh.setdefault(algo, {}).update(learnt)

    def save(self) -> None:
        """Append what was learnt to the store's files (best effort: it is a cache)."""
        with self._lock:
            fresh, self._fresh = self._fresh, {}
        for algo, learnt in fresh.items():
            path = self._file(algo)
            if path is None or not learnt:
                continue
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                # One write of whole lines in append mode: concurrent commands interleave
                # lines, never parts of them; a torn last line is skipped when read.
                with open(path, "a", encoding="ascii") as handle:
                    handle.write("".join(f"{oid} {digest}\n" for oid, digest in sorted(learnt.items())))
            except OSError:
                pass


def record_hashes(record: dict[str, RecordEntry], live: Mapping[str, str | None], digests: ContentDigests,
                  transport: Transport | None) -> dict[str, str | None]:
    """Each RECORD path's live hash (in RECORD's algorithm), by blob id from ``digests``
    where known, else hashed on the node (``transport``; None: left out).

    ``live``: ``{path: blob id}`` of the live tree (a link's id is its target's).
    """
    hashes: dict[str, str | None] = {}
    unknown: list[RecordEntry] = []
    for path, entry in record.items():
        oid = live.get(path)
        if oid is None or entry.digest is None or entry.algo is None or entry.algo not in hashlib.algorithms_guaranteed:
            continue
        digest = digests.known(entry.algo).get(oid)
        if digest is not None:
            hashes[path] = digest
        else:
            unknown.append(entry)
    if unknown and transport is not None:
        hashes.update(hash_like_record(transport, unknown))
    return hashes
