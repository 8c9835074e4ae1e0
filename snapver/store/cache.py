"""The store's side files: everything snapver keeps under ``<store>/snapver/`` beside git's own.

Each is a cache of something the store or a node can tell again, so a file that is
missing, damaged or of another version is a miss, never an error::

    stat-cache/<node>.json   the node's last listing: its blob ids, and the snapshot they made
    stat-cache/<node>.keys   that listing's stat keys as the node's ``list`` takes them
    stat-cache/<node>.record what the RECORD rows of the node's last snapshot were made from
    record-check/<node>.json how the node's snapshot stood against its RECORD
    digests-<algo>           RECORD-style digests by blob id, one ``oid digest`` line each
    compact.json, compact.lock  the background repack's counter and lock (``store/gc.py``)

A JSON file (or a header line) carries its kind's version as ``"v"``: a reader takes only
its own version. ``digests-<algo>`` has no header: commands append whole lines to it concurrently.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from snapver.store.repo import Store

FOLDER = "snapver"

STAT_CACHE_VERSION = 1
STAT_KEYS_VERSION = 1
RECORD_SOURCE_VERSION = 1
RECORD_CHECK_VERSION = 1
ENV_CACHE_VERSION = 1

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def folder(store: Store) -> Path:
    """The folder of the store's side files."""
    return store.path / FOLDER


def stat_cache_path(store: Store, node: str) -> Path:
    """The node's stat cache: its last listing's blob ids, and the snapshot they made."""
    return folder(store) / "stat-cache" / f"{node}.json"


def stat_keys_path(store: Store, node: str) -> Path:
    """Beside the stat cache: its stat keys as the node's ``list`` takes them (a line of JSON
    naming the commit and time, then the keys' JSON text), sent without re-encoding them."""
    return folder(store) / "stat-cache" / f"{node}.keys"


def record_source_path(store: Store, node: str) -> Path:
    """What the RECORD rows of the node's last snapshot were made from (``ops/pristine.py``)."""
    return folder(store) / "stat-cache" / f"{node}.record"


def env_cache_path(store: Store, node: str) -> Path:
    """The blob id of the environment the node's last snapshot recorded (``ops/envrecord.py``)."""
    return folder(store) / "stat-cache" / f"{node}.env"


def record_check_path(store: Store, node: str) -> Path:
    """How the node's snapshot stood against its RECORD (``ops/status.py``)."""
    return folder(store) / "record-check" / f"{node}.json"


def digests_path(store: Store, algo: str) -> Path:
    """RECORD-style ``algo`` digests of contents by blob id (``ops/record.py`` ContentDigests)."""
    return folder(store) / f"digests-{algo}"


def of_version(document: Mapping[str, Any], version: int) -> bool:
    """Whether a side file's JSON ``document`` is of ``version`` (any other, or none, is a miss)."""
    return document.get("v") == version


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``path`` whole, then rename it into place: a reader sees the old file or the
    new one, never a part. The temporary file is this thread's own, made afresh (never
    through a link); it is removed if the write fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        try:
            fd = os.open(tmp, _CREATE, 0o644)
        except FileExistsError:  # left by a killed process of the same id: no live writer has it
            os.unlink(tmp)
            fd = os.open(tmp, _CREATE, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
