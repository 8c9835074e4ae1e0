"""Which files of a snapshot are pristine files of its distribution (listed in its RECORD).

A pull keeps, beside the manifest, the RECORD rows of the tracked paths of the
distribution the node has installed (``.snapver/record``). A rebase uses them to tell a
file the new release ships from one only left behind (pip removes what RECORD lists and
nothing else): a patch's added file is dropped only in favour of the former.
"""

from __future__ import annotations

import hashlib

from snapver.errors import SnapverError
from snapver.model import Entry
from snapver.store.repo import Store
from snapver.transport.base import Transport

RECORD_PATH = ".snapver/record"


def record_file(transport: Transport) -> bytes | None:
    """The node's RECORD rows for tracked paths, one ``algo hexdigest path`` line each,
    sorted; None when no installed distribution owns the tracked paths."""
    from snapver.ops.verify import read_record

    try:
        record, _ = read_record(transport)
    except SnapverError:
        return None  # no dist-info (a source checkout, a folder): nothing to keep
    lines = [f"{entry.algo} {entry.digest} {path}" for path, entry in sorted(record.items())
             if entry.algo and entry.digest and "\n" not in path]
    return ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape") if lines else b""


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
