"""verify: a node's live files against the pristine hashes in its distribution's RECORD.

The node reads and hashes its own files (sha256, or whatever algorithm RECORD names,
with the standard library); only the RECORD, the listing and the hashes cross the wire.
"""

from __future__ import annotations

import posixpath
import shlex
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from snapver.config import NodeSpec
from snapver.errors import RemotePathError, SnapverError
from snapver.ops.record import compare_with_record, hash_like_record, read_records
from snapver.ops.sourcetree import CommittedTree, compare_with_commit, from_checkout, request_head
from snapver.ops.trees import live_manifest
from snapver.transport.base import Transport
from snapver.transport.connect import open_transport


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
    against: str = ""  # what the files were held against when not a RECORD: "git v0.5.23 (a1b2c3d)"
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
                "remove_leftovers": self.remove_leftovers, "against": self.against or None,
                "error": str(self.error) if self.error else None, "exit_code": self.exit_code}


def verify(specs: list[NodeSpec]) -> list[NodeVerify]:
    """Verify every node in ``specs`` against its RECORD, in parallel."""
    with ThreadPoolExecutor(max(1, min(32, len(specs)))) as pool:
        return list(pool.map(verify_node, specs))


def verify_node(spec: NodeSpec) -> NodeVerify:
    result = NodeVerify(spec.name)
    try:
        with open_transport(spec) as transport:
            if from_checkout(transport.info):
                _verify_against_head(transport, result)
                return result
            record, dists, leftovers, leftover_record = read_records(transport)
            result.dists = [f"{d.name} {d.version}" for d in dists]
            result.leftovers = [f"{d.name} {d.version} ({d.dist_info})" for d in leftovers]
            if leftovers:
                site = transport.info.site_packages if transport.info else ""
                result.remove_leftovers = "rm -rf " + " ".join(shlex.quote(posixpath.join(site, d.dist_info))
                                                              for d in leftovers)
            live = {e.path for e in transport.list_tree(want_oids=False).entries}
            hashes = hash_like_record(transport, [e for e in record.values() if e.path in live])
            check = compare_with_record(record, live, hashes)
            result.checked, result.modified, result.missing = check.checked, check.modified, check.missing
            result.unverifiable = check.unverifiable
            result.leftover_files = [path for path in check.extra if path in leftover_record]
            result.extra = [path for path in check.extra if path not in leftover_record]
    except SnapverError as exc:
        result.error = exc
    return result


def _verify_against_head(transport: Transport, result: NodeVerify) -> None:
    """An editable or source install in a git checkout: its live files against HEAD's blobs."""
    spec = transport.spec
    committed = request_head(transport)()
    if not isinstance(committed, CommittedTree):
        raise RemotePathError(f"{spec.name}: {committed}",
                              hint="verify holds an editable install against its checkout's HEAD (git on the node), "
                              "a wheel against its RECORD; `snapver status --against REF` compares with a snapshot")
    differing = compare_with_commit(committed, live_manifest(transport.list_tree()))
    result.against = committed.label
    result.dists = [committed.label]
    result.checked = len(committed.entries)
    result.modified = [path for path, status in differing if status in ("M", "T")]
    result.missing = [path for path, status in differing if status == "D"]
    result.extra = [path for path, status in differing if status == "A"]
