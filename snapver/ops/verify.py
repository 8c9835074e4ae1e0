"""verify: a node's live files against the pristine hashes in its distribution's RECORD.

The node reads and hashes its own files (sha256, or whatever algorithm RECORD names,
with the standard library); only the RECORD, the listing and the hashes cross the wire.
Several dist-infos of one distribution (``pip install --ignore-installed`` of another
version) are told apart by what Python imports: the one whose version the package's
``version.py`` states is checked; the others are leftovers, reported with the command
that removes them, and the files only their RECORD lists are leftovers too, not changes.
"""

from __future__ import annotations

import base64
import csv
import functools
import hashlib
import io
import posixpath
import re
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from snapver.config import NodeSpec
from snapver.errors import RemotePathError, SnapverError
from snapver.model import DistInfo, is_safe_relpath
from snapver.transport import agent
from snapver.transport.base import Transport
from snapver.transport.connect import open_transport


@dataclass(frozen=True)
class RecordEntry:
    """One RECORD row for a tracked path: its hash (hex) if RECORD gives one."""

    path: str
    algo: str | None
    digest: str | None
    size: int | None


@dataclass
class NodeVerify:
    """What verifying one node found."""

    node: str
    dists: list[str] = field(default_factory=list)
    checked: int = 0
    modified: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    extra: list[str] = field(default_factory=list)
    unverifiable: list[str] = field(default_factory=list)
    leftovers: list[str] = field(default_factory=list)  # "name version (folder.dist-info)"
    leftover_files: list[str] = field(default_factory=list)  # only a leftover's RECORD lists them
    remove_leftovers: str | None = None  # the command that removes the leftover dist-infos
    error: SnapverError | None = None

    @property
    def clean(self) -> bool:
        return not (self.modified or self.missing or self.extra)

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return self.error.exit_code
        return 0 if self.clean else 1

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "dists": self.dists, "checked": self.checked, "modified": self.modified,
                "missing": self.missing, "extra": self.extra, "unverifiable": self.unverifiable,
                "leftovers": self.leftovers, "leftover_files": self.leftover_files,
                "remove_leftovers": self.remove_leftovers,
                "error": str(self.error) if self.error else None, "exit_code": self.exit_code}


def verify(specs: list[NodeSpec]) -> list[NodeVerify]:
    """Verify every node in ``specs`` against its RECORD, in parallel."""
    with ThreadPoolExecutor(max(1, min(32, len(specs)))) as pool:
        return list(pool.map(verify_node, specs))


def verify_node(spec: NodeSpec) -> NodeVerify:
    result = NodeVerify(spec.name)
    try:
        with open_transport(spec) as transport:
            record, dists, leftovers, leftover_record = read_records(transport)
            result.dists = [f"{d.name} {d.version}" for d in dists]
            result.leftovers = [f"{d.name} {d.version} ({d.dist_info})" for d in leftovers]
            if leftovers:
                site = transport.info.site_packages if transport.info else ""
                result.remove_leftovers = "rm -rf " + " ".join(shlex.quote(posixpath.join(site, d.dist_info))
                                                              for d in leftovers)
            live = {e.path for e in transport.list_tree(want_oids=False).entries}
            hashes = hash_like_record(transport, [e for e in record.values() if e.path in live])
            for path, entry in sorted(record.items()):
                if path not in live or (entry.digest is not None and hashes.get(path) is None):
                    result.missing.append(path)
                elif entry.digest is None or entry.algo not in hashlib.algorithms_guaranteed:
                    result.unverifiable.append(path)
                else:
                    result.checked += 1
                    if hashes[path] != entry.digest:
                        result.modified.append(path)
            unlisted = live - set(record)
            result.leftover_files = sorted(unlisted & set(leftover_record))
            result.extra = sorted(unlisted - set(leftover_record))
    except SnapverError as exc:
        result.error = exc
    return result


def read_record(transport: Transport) -> tuple[dict[str, RecordEntry], list[DistInfo]]:
    """The RECORD rows of the installed distributions owning the tracked paths (tracked paths only)."""
    record, dists, _, _ = read_records(transport)
    return record, dists


def read_known_records(transport: Transport) -> dict[str, RecordEntry]:
    """Every dist-info's RECORD rows for tracked paths, the installed one's winning: what
    any install put there (a leftover's files are pristine leftovers, not hot-fixes)."""
    record, _, _, leftover_record = read_records(transport)
    return {**leftover_record, **record}


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
    one is the version the package itself states; when none says, all count (as before)."""
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
    info = transport.info
    spec = transport.spec
    assert info is not None
    dists = list(info.dists)
    if not dists:
        raise RemotePathError(f"{spec.name}: no installed distribution (*.dist-info) owns "
                              f"{', '.join(spec.paths)} in {info.site_packages}",
                              hint="verify needs the RECORD that pip wrote when it installed the package")
    dists, leftovers = _installed(transport, dists)
    leftover_names = {f"{d.dist_info}/RECORD" for d in leftovers}
    record: dict[str, RecordEntry] = {}
    leftover_record: dict[str, RecordEntry] = {}
    found = False
    for path, kind, data in transport.read_files([f"{d.dist_info}/RECORD" for d in dists + leftovers]):
        if kind is None:
            continue
        found = found or path not in leftover_names
        for entry in parse_record(data):
            if is_tracked(entry.path, spec.paths, spec.exclude):
                (leftover_record if path in leftover_names else record)[entry.path] = entry
    if not found:
        raise RemotePathError(f"{spec.name}: {', '.join(d.dist_info for d in dists)} has no RECORD file")
    return record, dists, leftovers, leftover_record


def parse_record(data: bytes) -> list[RecordEntry]:
    """RECORD (CSV: path, ``algo=urlsafe-base64``, size) → entries with hex digests."""
    entries = []
    text = data.decode("utf-8", "surrogateescape")
    for row in csv.reader(io.StringIO(text)):
        if not row or not row[0]:
            continue
        path = posixpath.normpath(row[0])
        if not is_safe_relpath(path):
            continue  # e.g. ../../bin/sglang: outside site-packages, never tracked
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


_exclusion = functools.lru_cache(maxsize=8)(agent.exclusion)  # patterns compiled once per config


def is_tracked(path: str, tracked: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    """True when ``path`` lies under a tracked path and no exclude pattern drops it (as the agent walks)."""
    for root in tracked:
        if not path.startswith(root + "/"):
            continue
        parts = path.split("/")
        depth = len(root.split("/"))
        excluded = _exclusion(exclude)
        for index in range(depth, len(parts)):
            is_dir = index < len(parts) - 1
            if excluded(parts[index], "/".join(parts[:index + 1]), is_dir):
                return False
        return True
    return False


def hash_like_record(transport: Transport, entries: list[RecordEntry]) -> dict[str, str | None]:
    """Hash each entry's live file on the node with the algorithm its RECORD row names."""
    by_algo: dict[str, list[str]] = {}
    for entry in entries:
        if entry.algo in hashlib.algorithms_guaranteed and entry.digest:
            by_algo.setdefault(entry.algo, []).append(entry.path)
    hashes: dict[str, str | None] = {}
    for algo, paths in by_algo.items():
        hashes.update(transport.hash_files(paths, algo))
    return hashes
