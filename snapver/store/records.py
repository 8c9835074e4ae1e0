"""The metadata a snapver commit carries: the JSON trailer of its message, and its fields.

Every commit snapver writes ends its message with one ``snapver-meta: {json}`` line
(``format_message``; read back by ``parse_meta``): that line is the on-disk format of a
snapshot's, a push record's, a patch's or a tag event's metadata, and survives ``git clone``.
A snapshot's, an import's and a push record's metadata are each made by one builder here
(``snapshot_meta``, ``import_meta``, ``push_record_meta``): a new field goes there.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from snapver.model import Manifest, NodeInfo

META_PREFIX = "snapver-meta: "
# The kinds of commit whose tree is exactly their manifest's files, checked by `fsck` and `sync`.
MANIFEST_KINDS = ("snapshot", "patch", "push")


def moment_ns(when: datetime) -> int:
    """A record's time to the microsecond, in nanoseconds (its meta's ``time_ns``)."""
    return round(when.timestamp() * 1_000_000) * 1000


def parse_meta(message: str) -> dict[str, Any]:
    for line in message.splitlines():
        if line.startswith(META_PREFIX):
            try:
                return json.loads(line[len(META_PREFIX):])
            except json.JSONDecodeError:
                return {}
    return {}


def format_message(subject: str, meta: dict[str, Any], body: str = "") -> str:
    text = subject.strip() + "\n\n"
    if body.strip():
        text += body.strip() + "\n\n"
    return text + META_PREFIX + json.dumps(meta, ensure_ascii=True, sort_keys=True, separators=(",", ":")) + "\n"


def snapshot_meta(*, node: str, host: str, writer: str, info: NodeInfo, when: datetime, paths: Iterable[str],
                  exclude: Iterable[str], manifest: Manifest, changed: int, event: dict[str, Any] | None = None,
                  message: str = "", container: dict[str, Any] | None = None,
                  env: str | None = None) -> dict[str, Any]:
    """A pulled snapshot's metadata: the node and what it reported (``info``), what the
    listing observed, the manifest's size; ``event`` (default ``{"event": "pull"}``) says
    what took it and may add fields of its own; ``container``: the node's container and
    image ids (``ops/layer.py``), for a node in a container; ``env``: the blob id of the
    environment it recorded (``.snapver/env``)."""
    meta: dict[str, Any] = {
        "v": 1, "kind": "snapshot", "node": node, "host": host,
        "writer": writer,
        "site_packages": info.site_packages, "hostname": info.hostname, "python": info.python_version,
        "time": when.isoformat(timespec="seconds"), "time_ns": moment_ns(when),
        # What the listing observed: a later comparison covers only what both sides observed.
        "paths": list(paths), "exclude": list(exclude),
        "dists": [[d.name, d.version] for d in info.dists], "files": len(manifest),
        "changed": changed, "bytes": manifest.total_size(), **(event or {"event": "pull"}),
    }
    install = info.install
    if install is not None and install.from_source:  # no dist-info in the root: what the node's Python found
        meta["install"] = install.to_json()
        meta["dists"] = meta["dists"] or ([[install.name, install.version]] if install.version else [])
    if message:
        meta["message"] = message
    if container is not None:
        meta["container"] = container
    if env:
        meta["env"] = env
    return meta


def import_meta(*, node: str, writer: str, source: str, layout: str, site_packages: str, when: datetime,
                imported: datetime, paths: Iterable[str], exclude: Iterable[str], dists: list[list[str]],
                manifest: Manifest, changed: int, message: str = "") -> dict[str, Any]:
    """An imported snapshot's metadata (``event: import``): the folder it came from, dated
    ``when`` (the snapshot's own time), taken at ``imported``."""
    meta: dict[str, Any] = {
        "v": 1, "kind": "snapshot", "event": "import", "node": node, "host": "import",
        "writer": writer, "source": source, "layout": layout,
        "site_packages": site_packages,
        "time": when.isoformat(timespec="seconds"),
        "imported": imported.isoformat(timespec="seconds"),
        "paths": list(paths), "exclude": list(exclude), "dists": dists, "files": len(manifest), "changed": changed,
        "bytes": manifest.total_size(),
    }
    if message:
        meta["message"] = message
    return meta


def push_record_meta(fields: dict[str, Any], *, writer: str, action: str, push_id: str,
                     when: datetime, container: dict[str, Any] | None = None) -> dict[str, Any]:
    """A push record's metadata: ``fields`` (what the push and this node's row say: state,
    patch, files, restore point, …) under the fields every record has, which win;
    ``container``: the ids of the container the push wrote into (``ops/layer.py``)."""
    meta = {**fields, "v": 1, "kind": "push", "writer": writer,
            "action": action, "push_id": push_id, "time": when.isoformat(timespec="seconds"),
            "time_ns": moment_ns(when)}
    if container is not None:
        meta["container"] = container
    return meta
