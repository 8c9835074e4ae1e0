"""What a tree observed: the tracked paths and exclude patterns it was read with.

A snapshot taken with ``*.so`` excluded says nothing about ``.so`` files: it neither
holds them nor says they were absent. So a comparison or a restore covers only the
paths both sides observed, and names what it left out. A snapshot made before scopes
were recorded is assumed to have been taken with the config's paths and exclude, and
the result says that it assumed so.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from snapver.config import DEFAULT_EXCLUDE, DEFAULT_PATHS, Config, NodeSpec
from snapver.errors import SnapverError
from snapver.model import Manifest
from snapver.store.repo import Commit, Store
from snapver.transport.agent.listing import exclusion

_exclusion = functools.lru_cache(maxsize=8)(exclusion)  # the agent's own rules, compiled once


@functools.lru_cache(maxsize=8)
def tracked_filter(tracked: tuple[str, ...], exclude: tuple[str, ...]) -> Callable[[str], bool]:
    """A function path -> tracked?: under a tracked path and dropped by no exclude pattern,
    as the agent's walk decides. Each folder's answer is remembered (a RECORD or a
    manifest lists a folder's files together: its folders are matched once, not per file)."""
    excluded = _exclusion(exclude)
    folders: dict[tuple[int, str], bool] = {}  # (depth of the root, folder) -> excluded?

    def folder_excluded(depth: int, folder: str) -> bool:
        answer = folders.get((depth, folder))
        if answer is None:
            parts = folder.split("/")
            answer = folders[(depth, folder)] = any(
                excluded(parts[index], "/".join(parts[:index + 1]), True) for index in range(depth, len(parts)))
        return answer

    def keep(path: str) -> bool:
        for root in tracked:
            if not path.startswith(root + "/"):
                continue
            depth = root.count("/") + 1
            folder, _, name = path.rpartition("/")
            return not folder_excluded(depth, folder) and not excluded(name, path, False)
        return False

    return keep


def is_tracked(path: str, tracked: tuple[str, ...], exclude: tuple[str, ...]) -> bool:
    """True when ``path`` lies under a tracked path and no exclude pattern drops it."""
    return tracked_filter(tuple(tracked), tuple(exclude))(path)


@dataclass(frozen=True)
class Scope:
    """The paths a tree was read under and the patterns it left out.

    ``recorded`` False: the snapshot predates scope records, and this scope is assumed.
    """

    paths: tuple[str, ...]
    exclude: tuple[str, ...]
    recorded: bool = True

    def covers(self, path: str) -> bool:
        return tracked_filter(self.paths, self.exclude)(path)

    def same_as(self, other: Scope) -> bool:
        return self.paths == other.paths and set(self.exclude) == set(other.exclude)

    def to_meta(self) -> dict[str, list[str]]:
        """The keys a snapshot's metadata keeps it under."""
        return {"paths": list(self.paths), "exclude": list(self.exclude)}

    def to_json(self) -> dict[str, Any]:
        return {**self.to_meta(), "recorded": self.recorded}

    def beyond(self, other: Scope) -> str:
        """What this scope leaves out that ``other`` does not, in a few words (``*.so``)."""
        parts = [pattern for pattern in self.exclude if pattern not in other.exclude]
        if self.paths != other.paths:
            parts.append(f"paths {', '.join(self.paths)}")
        return ", ".join(parts)


def node_scope(spec: NodeSpec) -> Scope:
    """What a live node is read under now: its config."""
    return Scope(tuple(spec.paths), tuple(spec.exclude))


def default_scope(config: Config, node: str | None) -> Scope:
    """What the config says a node (else any node) is read under: the assumption for a
    snapshot whose scope is not recorded."""
    spec = config.nodes.get(node) if node else None
    if spec is None and config.nodes:
        spec = next(iter(config.nodes.values()))
    return node_scope(spec) if spec is not None else Scope(DEFAULT_PATHS, DEFAULT_EXCLUDE)


def _strings(value: object) -> tuple[str, ...] | None:
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return None


def recorded_scope(meta: Mapping[str, Any], fallback: Scope) -> Scope:
    """The scope a snapshot's metadata records; ``fallback`` (marked not recorded) for what it lacks."""
    paths, exclude = _strings(meta.get("paths")), _strings(meta.get("exclude"))
    if paths and exclude is not None:
        return Scope(paths, exclude)
    return Scope(paths or fallback.paths, fallback.exclude, recorded=False)


def commit_scope(store: Store, commit: Commit, fallback: Scope) -> Scope:
    """The scope of a snapshot, or of a patch (its base snapshot's, unless it records one);
    ``fallback``, marked assumed, where the metadata does not say."""
    meta = commit.meta
    base = meta.get("base")
    if meta.get("kind") == "patch" and "exclude" not in meta and isinstance(base, str):
        try:
            meta = {**store.commit(base).meta, "paths": meta.get("paths")}
        except SnapverError:
            pass  # a base gone from the store: the patch's scope stays unknown
    return recorded_scope(meta, fallback)


def owner_scope(config: Config, commit: Commit) -> Scope:
    """What the config says the node of a snapshot or patch is read under now."""
    node = commit.meta.get("node") or commit.meta.get("base_node")
    return default_scope(config, node if isinstance(node, str) else None)


@dataclass
class LeftOut:
    """Files of a comparison outside one side's scope: not compared, left alone."""

    side: str  # how the side is named in a note: "when A (1a2b3c4d5e) was taken", "by ct200 (live)"
    paths: list[str]
    why: str  # the patterns (or paths) that scope has and the other lacks

    def note(self, verb: str) -> str:
        """``not compared: 7 files excluded when A (1a2b3c4d5e) was taken (*.so)``."""
        count = f"{len(self.paths)} file{'s' if len(self.paths) != 1 else ''}"
        return f"{verb}: {count} excluded {self.side}" + (f" ({self.why})" if self.why else "")


def unrecorded_note(label: str, scope: Scope) -> str:
    """What a side whose scope was assumed says."""
    return (f"{label} does not record the paths and exclude it was taken with (an older snapver): "
            f"assumed {', '.join(scope.paths)} excluding {', '.join(scope.exclude) or 'nothing'}, as the config says")


def left_out(a: Iterable[str], b: Iterable[str], scope_a: Scope, scope_b: Scope, side_a: str,
             side_b: str) -> list[LeftOut]:
    """The paths of either tree outside one side's scope, by the side that left them out
    (a path outside both is counted once, for ``a``). ``side_a``/``side_b``: how notes name them."""
    if scope_a.same_as(scope_b):
        return []
    present = sorted(set(a) | set(b), key=os.fsencode)
    out_a = [path for path in present if not scope_a.covers(path)]
    dropped = set(out_a)
    out_b = [path for path in present if path not in dropped and not scope_b.covers(path)]
    return [LeftOut(side, paths, scope.beyond(other))
            for side, paths, scope, other in ((side_a, out_a, scope_a, scope_b), (side_b, out_b, scope_b, scope_a))
            if paths]


def within_both(a: Manifest, b: Manifest, scope_a: Scope, scope_b: Scope, side_a: str,
                side_b: str) -> tuple[Manifest, Manifest, list[LeftOut]]:
    """Both manifests cut to the paths both scopes cover, and what was left out (``left_out``)."""
    left = left_out(a.entries, b.entries, scope_a, scope_b, side_a, side_b)
    dropped = {path for out in left for path in out.paths}
    return _without(a, dropped), _without(b, dropped), left


def _suffix(path: str) -> str:
    return os.path.splitext(path.rpartition("/")[2])[1]


def maybe_excluded(snapshot: Iterable[str], absent: Iterable[str], scope: Scope, side: str) -> LeftOut | None:
    """Of the files ``absent`` from a snapshot whose scope is not recorded, those it may only
    have excluded: no file of the snapshot has their suffix (it holds ``.py`` files, so a
    ``.py`` file it lacks was not there; it holds no ``.so``, so perhaps it left them out).
    A restore leaves them alone; None when there are none (or the scope is recorded)."""
    if scope.recorded:
        return None
    seen = {_suffix(path) for path in snapshot}
    unsure = sorted((path for path in absent if _suffix(path) not in seen), key=os.fsencode)
    if not unsure:
        return None
    kinds = sorted({_suffix(path) or "no suffix" for path in unsure})
    return LeftOut(side, unsure, f"it holds no {', '.join(kinds)} file: its exclude may have left them out")


def _without(manifest: Manifest, paths: Iterable[str]) -> Manifest:
    gone = set(paths)
    if not gone.intersection(manifest.entries):
        return manifest
    return Manifest({path: entry for path, entry in manifest.entries.items() if path not in gone})
