"""Trees to compare: loading either side of a comparison (a snapshot, a patch, a live node
or a folder) as a manifest, and choosing the paths a command's operands name.

Shared by diff, status (``--against``, the fleet matrix) and whatever compares trees.
"""

from __future__ import annotations

import difflib
import fnmatch
import os
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from snapver.config import Config
from snapver.environment import Environment
from snapver.errors import SnapverError, UsageError
from snapver.folders import tracked_paths
from snapver.model import Entry, Manifest, is_safe_relpath
from snapver.ops.envrecord import environment_or_none, snapshot_environment
from snapver.ops.live import request_live
from snapver.ops.scope import Scope, commit_scope, node_scope, owner_scope
from snapver.refs import TreeRef
from snapver.store.repo import Commit, Store
from snapver.transport.base import Listing, Transport
from snapver.transport.connect import Starting, open_transport


@dataclass
class Side:
    """One tree of a diff: what the ref named, and the tree as a manifest."""

    ref: TreeRef
    manifest: Manifest
    node: str | None = None
    commit: Commit | None = None
    transport: Transport | None = field(default=None, repr=False)
    scope: Scope | None = None  # the paths and exclude this tree was read with
    environment: Environment | None = None  # with ``load_sides(environments=True)``: the ground under it

    @property
    def observed_by(self) -> str:
        """How a note names the side whose scope left a file out: ``when A (1a2b3c4d5e) was taken``."""
        return f"by {self.label}" if self.ref.folder is not None or self.ref.is_live else f"when {self.label} was taken"

    @property
    def kind(self) -> str:
        if self.ref.folder is not None:
            return "folder"
        if self.ref.is_live:
            return "live"
        return str(self.commit.meta.get("kind", "snapshot")) if self.commit else "snapshot"

    @property
    def label(self) -> str:
        """How messages name this side: ``ct200 (live)``, ``./dir (folder)`` or ``v1 (1a2b3c4d5e)``."""
        if self.ref.folder is not None:
            return f"{self.ref.text} (folder)"
        if self.ref.is_live:
            return f"{self.node} (live)"
        assert self.commit is not None
        return f"{self.ref.text} ({self.commit.short})"

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {"ref": self.ref.text, "kind": self.kind, "node": self.node,
                                    "files": len(self.manifest)}
        if self.commit is not None:
            document.update(commit=self.commit.id, time=self.commit.time.astimezone().isoformat())
        if self.ref.folder is not None:
            document.update(self.ref.folder.to_json())
        if self.scope is not None:
            document["scope"] = self.scope.to_json()
        return document


def load_sides(store: Store | None, config: Config, trees: list[TreeRef], checksum: bool = False,
                starting: Starting | None = None, environments: bool = False) -> list[Side]:
    """Both sides' manifests, loaded in parallel: a live node hashes its files while the
    store is read (or while the other node hashes its own). ``environments``: each side's
    environment too where it has one (a snapshot that recorded it; a live node's, asked in
    the listing's round trip, without its GPU)."""
    sides = [Side(tree, Manifest()) for tree in trees]

    def load(side: Side) -> SnapverError | None:
        try:
            if side.ref.is_live:
                side.node = side.ref.live_node
                begun = starting.take(side.node) if starting is not None and side.node else None
                side.transport = begun or open_live(config, side.ref).start()
                asked = side.transport.request_environment(gpu=False) if environments and side.node else None
                # A folder has no stat cache in the store: it is hashed in full.
                listing = request_live(store if side.node else None, side.transport, checksum)
                side.environment = environment_or_none(asked, side.transport)
                side.manifest = live_manifest(listing())
            else:
                assert store is not None and side.ref.commit is not None
                side.commit = store.commit(side.ref.commit)
                side.node = side.commit.meta.get("node")
                side.manifest = store.manifest(side.ref.commit)
                if environments:
                    side.environment = snapshot_environment(store, side.commit.id, side.commit.meta)
        except SnapverError as exc:
            return exc
        return None

    with ThreadPoolExecutor(len(sides)) as pool:
        errors = [error for error in pool.map(load, sides) if error is not None]
    if errors:
        for side in sides:
            if side.transport is not None:
                side.transport.close()
        raise errors[0]
    return sides


def side_scope(store: Store | None, config: Config, side: Side) -> Scope:
    """The scope a side was read with: a live node's config, a folder's tracked paths, or
    what a snapshot records (the config's, marked assumed, for one that records none)."""
    if side.ref.folder is not None:
        return Scope(side.ref.folder.tracked, side.ref.folder.exclude)
    if side.ref.is_live:
        assert side.node is not None
        return node_scope(config.node(side.node))
    assert store is not None and side.commit is not None
    return commit_scope(store, side.commit, owner_scope(config, side.commit))


def open_live(config: Config, ref: TreeRef) -> Transport:
    """The (unstarted) transport of a live tree: a configured node, or a folder given as a ref."""
    if ref.folder is not None:
        from snapver.transport.local import FolderTransport

        return FolderTransport(ref.folder.spec(), ref.folder.roots)
    assert ref.live_node is not None
    return open_transport(config.node(ref.live_node))


def live_manifest(listing: Listing) -> Manifest:
    """A node's listing as a manifest keyed by git blob id (``digest`` is not known live)."""
    return Manifest.of(Entry(e.path, e.kind, e.mode, e.size, "", e.oid) for e in listing.entries)


def read_contents(store: Store | None, side: Side, entries: Iterable[Entry]) -> dict[str, bytes]:
    """``{path: content}`` of ``entries`` from the side's node (one stream) or the store."""
    wanted = list(entries)
    if not wanted:
        return {}
    if side.transport is not None:
        return {path: data for path, kind, data in side.transport.read_files([e.path for e in wanted])
                if kind is not None}
    assert store is not None
    blobs = dict(store.read_blobs(e.oid for e in wanted))
    return {e.path: blobs[e.oid] for e in wanted}


# -- path filters ------------------------------------------------------------------------------

def normalize_paths(paths: Sequence[str]) -> list[str]:
    """Clean path filters (relative to site-packages); refuse absolute paths and ``..``."""
    cleaned = []
    for raw in paths:
        path = raw.strip()
        while path.startswith("./"):
            path = path[2:]
        path = path.rstrip("/")
        if not path or not is_safe_relpath(path):
            raise UsageError(f"bad path {raw!r}: paths are relative to site-packages, without '..'",
                             hint="e.g. sglang/srt/speculative")
        cleaned.append(path)
    return cleaned


def path_matches(path: str, filters: Sequence[str]) -> bool:
    """True when ``path`` is a filter, lies inside one, or matches one as a glob."""
    for pattern in filters:
        if path == pattern or path.startswith(pattern + "/"):
            return True
        if any(ch in pattern for ch in "*?[") and fnmatch.fnmatchcase(path, pattern):
            return True
    return False


def tracked_roots(config: Config, *sides: Side) -> list[str]:
    """The tracked paths a path operand may be relative to: the config's, each side's."""
    roots = dict.fromkeys(tracked_paths(config))
    for side in sides:
        if side.ref.folder is not None:
            roots.update(dict.fromkeys(side.ref.folder.tracked))
        elif side.commit is not None:
            roots.update(dict.fromkeys(side.commit.meta.get("paths") or ()))
    return list(roots)


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def _basename(path: str) -> str:
    return path.rsplit("/", 1)[-1]


def match_operand(operand: str, paths: Iterable[str], roots: Sequence[str]) -> list[str]:
    """The files one path operand names, the first of these rules that matches any:

    1. a file or folder relative to site-packages (``sglang/srt/speculative``);
    2. one relative to a tracked path (``speculative/dflash_worker.py``);
    3. a glob (on the path from site-packages, from a tracked path, or on the file name
       when it has no ``/``) or a file name (``dflash_worker.py``: every file so called).
    """
    listed = list(paths)
    found = [path for path in listed if path_matches(path, [operand])]
    if not found:
        under = [f"{root}/{operand}" for root in roots]
        found = [path for path in listed if path_matches(path, under)]
    if not found and _is_glob(operand):
        def glob_hit(path: str) -> bool:
            if fnmatch.fnmatchcase(path, operand):
                return True
            if "/" not in operand and fnmatch.fnmatchcase(_basename(path), operand):
                return True
            return any(path.startswith(root + "/") and fnmatch.fnmatchcase(path[len(root) + 1:], operand)
                       for root in roots)

        found = [path for path in listed if glob_hit(path)]
    if not found and "/" not in operand and not _is_glob(operand):
        found = [path for path in listed if _basename(path) == operand]
    return sorted(found, key=os.fsencode)


def select_paths(operands: Sequence[str], paths: Iterable[str], roots: Sequence[str],
                 where: str = "either tree") -> dict[str, list[str]]:
    """``{operand: the files it names}`` (see ``match_operand``); operands naming none are one
    UsageError (exit 2) naming every one of them, with the paths closest to each."""
    listed = sorted(set(paths), key=os.fsencode)
    matched = {operand: match_operand(operand, listed, roots) for operand in operands}
    missing = [operand for operand, found in matched.items() if not found]
    if missing:
        raise _no_match(missing, listed, roots, where)
    return matched


def _no_match(missing: list[str], listed: list[str], roots: Sequence[str], where: str) -> UsageError:
    where_roots = f"site-packages or to {', '.join(roots)}" if roots else "site-packages"
    rules = f"a path is relative to {where_roots}, a file name, or a glob"
    offers = {operand: closest_paths(operand, listed, roots) for operand in missing}
    if len(missing) == 1:
        near = offers[missing[0]]
        return UsageError(f"path {missing[0]!r} matches no file in {where}",
                          hint=f"did you mean {' or '.join(near)}? ({rules})" if near else rules)
    said = [f"{operand}: did you mean {' or '.join(near)}?" for operand, near in offers.items() if near]
    return UsageError(f"paths {', '.join(map(repr, missing))} match no file in {where}",
                      hint="; ".join([*said, rules]))


SUGGESTED = 3  # paths offered per operand that matched nothing


def closest_paths(operand: str, paths: Iterable[str], roots: Sequence[str]) -> list[str]:
    """The files or folders nearest to a path operand that matched nothing, nearest first.

    Ranked by the folders and the name together: the share of the operand's folders the
    path lies in, the file names' similarity, and a bonus when one name holds the other
    (``cuda_graph_runner.py`` → ``model_executor/runner/decode_cuda_graph_runner.py``
    before ``model_executor/cpu_graph_runner.py``). Globs get no suggestion.
    """
    if _is_glob(operand):
        return []
    relative = next((operand[len(root) + 1:] for root in roots if operand.startswith(root + "/")), operand)
    *folders, name = relative.split("/")
    stem = name.rsplit(".", 1)[0]
    candidates = set()
    for path in paths:
        candidates.add(path)
        parts = path.split("/")
        candidates.update("/".join(parts[:end]) for end in range(1, len(parts)))
    scored = []
    for candidate in candidates:
        *where, base = candidate.split("/")
        similar = difflib.SequenceMatcher(None, name, base).ratio()
        other = base.rsplit(".", 1)[0]
        holds = (len(stem) >= 3 and stem in base) or (len(other) >= 3 and other in name)
        if similar < 0.6 and not holds:
            continue
        in_folders = sum(folder in where for folder in folders) / len(folders) if folders else 0.0
        scored.append((-(in_folders + similar + (0.5 if holds else 0.0)), candidate))
    return [candidate for _score, candidate in sorted(scored)[:SUGGESTED]]


def one_path(operand: str, paths: Iterable[str], roots: Sequence[str], where: str) -> str:
    """The one file a path operand names (the grammar of ``diff -- PATH``): an operand that
    names none, or several, is a UsageError (exit 2) listing the nearest or those it names."""
    found = select_paths([operand], paths, roots, where)[operand]
    if len(found) > 1:
        shown = ", ".join(found[:8]) + (f" and {len(found) - 8} more" if len(found) > 8 else "")
        raise UsageError(f"path {operand!r} names {len(found)} files in {where}: {shown}",
                         hint="name one of them (a longer path, e.g. " + found[0] + ")")
    return found[0]
