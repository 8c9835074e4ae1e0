"""Plans as plain values, shared by push and rollback: no node, no store.

A plan is, per node, the list of paths to write or delete, each with the state the
node had when planned (kind and git blob id) and the entry it should end up with.
Writing a node's plan is ``ops/nodeio.py``; applying plans, ``ops/run.py``.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from snapver.config import NodeSpec
from snapver.errors import SnapverError
from snapver.model import FILE, LINK, SPECIAL, Entry
from snapver.transport.base import Transport

if TYPE_CHECKING:  # a patch's file is only read here; the patch verb needs nothing of plans
    from snapver.ops.patch import PatchFile

WRITE, DELETE, SKIP, CONFLICT = "write", "delete", "skip", "conflict"
MAX_PARALLEL = 16


@dataclass(frozen=True)
class Live:
    """A path as a node holds it now: kind ("f", "l" or "other"), git blob id, st_mode."""

    kind: str
    oid: str | None
    mode: int

    @classmethod
    def of(cls, state: list[Any] | None) -> Live | None:
        return None if state is None else cls(state[0], state[1], state[2])

    def matches(self, entry: Entry | None, with_mode: bool) -> bool:
        if entry is None or self.kind != entry.kind or self.oid != entry.oid:
            return False
        return not with_mode or entry.kind != FILE or stat.S_IMODE(self.mode) == stat.S_IMODE(entry.mode)


@dataclass
class Step:
    """One path of a node's plan: what it is now, what it should become, and why."""

    path: str
    action: str
    live: Live | None
    target: Entry | None
    keep_mode: bool = False  # write the content but keep the file's permission bits
    note: str = ""
    forced: bool = False

    def wire(self) -> list[Any]:
        """[path, kind or None to delete, permission bits or None to keep, expected state,
        blob id and size of the content to write]."""
        target = self.target if self.action == WRITE else None
        mode = None if target is None or self.keep_mode or target.kind == LINK else stat.S_IMODE(target.mode)
        expect = None if self.live is None else [self.live.kind, self.live.oid]
        return [self.path, target.kind if target else None, mode, expect,
                target.oid if target else None, target.size if target else None]


@dataclass
class NodePlan:
    """One node's plan; holds the node's open transport until closed."""

    spec: NodeSpec
    steps: list[Step] = field(default_factory=list)
    error: SnapverError | None = None
    transport: Transport | None = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)

    @property
    def node(self) -> str:
        return self.spec.name

    @property
    def writes(self) -> list[Step]:
        return [s for s in self.steps if s.action in (WRITE, DELETE)]

    @property
    def conflicts(self) -> list[Step]:
        return [s for s in self.steps if s.action == CONFLICT]

    def close(self) -> None:
        if self.transport is not None:
            transport, self.transport = self.transport, None
            transport.close()

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "error": str(self.error) if self.error else None, "notes": self.notes,
                "files": [{"path": s.path, "action": s.action, "note": s.note, "forced": s.forced}
                          for s in self.steps]}


def within(path: str, tracked: Iterable[str]) -> bool:
    return any(path.startswith(root.strip("/") + "/") for root in tracked)


def restore_steps(live: Mapping[str, Live | None], target: dict[str, Entry | None]) -> list[Step]:
    """The steps that make ``live`` exactly ``target`` (content, kind, mode; absent = delete).
    A special file (FIFO, socket, device) is never created: such a target is left as it is."""
    steps = []
    for path in sorted(set(live) | set(target), key=os.fsencode):
        now, wanted = live.get(path), target.get(path)
        if wanted is not None and wanted.kind == SPECIAL:
            if now is None or not now.matches(wanted, with_mode=False):
                steps.append(_never_created(path, now, wanted))
        elif wanted is None:
            if now is not None:
                steps.append(Step(path, DELETE, now, None, note="remove"))
        elif now is None:
            steps.append(Step(path, WRITE, None, wanted, note="restore (absent)"))
        elif not now.matches(wanted, with_mode=True):
            note = "restore mode" if now.matches(wanted, with_mode=False) else "restore"
            steps.append(Step(path, WRITE, now, wanted, note=note))
    return steps


def _never_created(path: str, now: Live | None, wanted: Entry) -> Step:
    """A FIFO, socket or device of a snapshot is not made again: the path is left as it is."""
    return Step(path, SKIP, now, wanted, note="a special file is never created: left as it is")


def first_of(paths: list[str], limit: int = 5) -> str:
    """The first ``limit`` paths, and how many more: for one-line messages."""
    return ", ".join(paths[:limit]) + (f" and {len(paths) - limit} more" if len(paths) > limit else "")


def _is(live: Live | None, entry: Entry | None, with_mode: bool) -> bool:
    return live is None and entry is None or live is not None and live.matches(entry, with_mode)


def undo_steps(live: dict[str, Live | None], wrote: dict[str, Entry | None], before: dict[str, Entry | None],
               force: bool = False) -> list[Step]:
    """The steps that put back ``before`` on the paths a write made ``wrote``: only where the
    path still holds what was written (or, ``force``, whatever it holds); a path changed
    since is a CONFLICT step, left alone. Paths already as before need nothing."""
    steps = []
    for path in sorted(wrote, key=os.fsencode):
        now, ours, wanted = live.get(path), wrote[path], before.get(path)
        action = WRITE if wanted is not None else DELETE
        if _is(now, wanted, with_mode=True):
            continue
        if wanted is not None and wanted.kind == SPECIAL:
            steps.append(_never_created(path, now, wanted))
        elif _is(now, ours, with_mode=False):
            steps.append(Step(path, action, now, wanted, note="undo"))
        elif force:
            steps.append(Step(path, action, now, wanted, note="forced: changed since it was written", forced=True))
        else:
            steps.append(Step(path, CONFLICT, now, wanted, note="changed since it was written: left alone"))
    return steps


def classify(item: PatchFile, live: Live | None, force: bool) -> Step:
    """Equal to the patch: skip; equal to the base: write; else a conflict (or, forced, write)."""
    with_mode = item.mode_changed
    # A content change keeps the node's own permission bits; a mode change sets them.
    keep_mode = item.base is not None and item.patch is not None and item.base.kind == FILE and not with_mode
    action = WRITE if item.patch is not None else DELETE
    if (live is None and item.patch is None) or (live is not None and live.matches(item.patch, with_mode)):
        return Step(item.path, SKIP, live, item.patch, note="already patched")
    if (live is None and item.base is None) or (live is not None and live.matches(item.base, with_mode)):
        return Step(item.path, action, live, item.patch, keep_mode=keep_mode,
                    note={WRITE: "add" if item.base is None else "patch", DELETE: "delete"}[action])
    if live is None:
        why = "missing on the node"
    elif live.kind not in (FILE, LINK):
        why = "not a file on the node"
    elif item.base is None:
        why = "already exists on the node with other content"
    else:
        why = "modified on the node (neither the base nor the patch)"
    if force:
        keep = keep_mode and live is not None and live.kind == FILE
        return Step(item.path, action, live, item.patch, keep_mode=keep, note=f"forced: {why}", forced=True)
    return Step(item.path, CONFLICT, live, item.patch, note=why)
