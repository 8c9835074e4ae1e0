"""log -- PATH, log -p, log --stat: each snapshot against its parent snapshot (the one
before it on the node's branch), for the snapshots where the paths changed."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from snapver.config import Config
from snapver.folders import tracked_paths
from snapver.model import ADDED, Change, Manifest, compare_manifests
from snapver.ops.diff import FileDiff, diff, file_diff, too_big_to_diff
from snapver.ops.log import SnapshotInfo, log
from snapver.ops.trees import match_operand, normalize_paths, select_paths
from snapver.store.repo import Store


@dataclass(frozen=True)
class Changes:
    """What a snapshot changed from its parent: the changes, and each as diff text."""

    changes: list[Change]
    files: list[FileDiff]

    def to_json(self) -> list[dict[str, Any]]:
        return [{"path": f.change.path, "status": f.change.status, "binary": f.binary, "added": f.added,
                 "removed": f.removed} for f in self.files]


@dataclass(frozen=True)
class LoggedSnapshot:
    """A snapshot, and when asked for, what changed from its parent (None: its node's first)."""

    snapshot: SnapshotInfo
    parent: str | None = None
    changes: Changes | None = None

    def to_json(self) -> dict[str, Any]:
        document = self.snapshot.to_json()
        if self.changes is not None:
            document.update(parent=self.parent, changes=self.changes.to_json())
        return document


class _Manifests:
    """Manifests read once each (a snapshot is the next one's parent)."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.read: dict[str, Manifest] = {}

    def __call__(self, commit: str | None) -> Manifest:
        if commit is None:
            return Manifest()
        if commit not in self.read:
            self.read[commit] = self.store.manifest(commit)
        return self.read[commit]


def log_changes(store: Store, config: Config, node: str | None, limit: int | None, since: datetime | None,
                paths: Sequence[str] = (), changes: bool = False) -> list[LoggedSnapshot]:
    """``log``, only the snapshots where a file ``paths`` name changed (all without paths),
    each with its diff from its parent when ``changes`` (contents: for -p and --stat)."""
    operands = normalize_paths(paths)
    roots = list(tracked_paths(config))
    manifests = _Manifests(store)
    found: list[LoggedSnapshot] = []
    for info in log(store, config, node, None if operands else limit, since):
        parent = _parent(store, info)
        chosen: list[str] = []
        if operands:
            changed = [c.path for c in compare_manifests(manifests(parent), manifests(info.id))]
            chosen = sorted({path for operand in operands for path in match_operand(operand, changed, roots)})
            if not chosen:
                continue
        found.append(LoggedSnapshot(info, parent, _changes(store, config, info.id, parent, chosen, manifests)
                                    if changes else None))
        if limit is not None and len(found) >= limit:
            break
    if operands and not found:
        _check_operands(operands, manifests, store, config, node, roots)
    return found


def _parent(store: Store, info: SnapshotInfo) -> str | None:
    """The snapshot before ``info`` on its node's branch (None for the node's first)."""
    parents = store.commit(info.id).parents
    if not parents:
        return None
    if store.commit(parents[0]).meta.get("node") != info.node:
        return None
    return parents[0]


def _changes(store: Store, config: Config, commit: str, parent: str | None, chosen: list[str],
             manifests: _Manifests) -> Changes:
    """``commit`` against ``parent`` (only ``chosen`` when given), as diff text."""
    if parent is not None:
        result = diff(store, config, parent, commit, chosen, contents=True)
        return Changes(result.changes, result.files or [])
    # A node's first snapshot: every file (of those chosen) is new.
    entries = [entry for path, entry in sorted(manifests(commit).entries.items()) if not chosen or path in chosen]
    added = [Change(entry.path, ADDED, None, entry) for entry in entries]
    readable = [change for change in added if not too_big_to_diff(change)]
    blobs = dict(store.read_blobs(change.new.oid for change in readable if change.new is not None))
    files = [file_diff(change, None, blobs.get(change.new.oid) if change.new else None,
                       whole=not too_big_to_diff(change)) for change in added]
    return Changes(added, files)


def _check_operands(operands: list[str], manifests: _Manifests, store: Store, config: Config, node: str | None,
                    roots: list[str]) -> None:
    """Operands that name no file of the newest snapshot are an error with suggestions."""
    newest = log(store, config, node, 1)
    if newest:
        select_paths(operands, manifests(newest[0].id).entries, roots, f"snapshot {newest[0].id[:10]}")
