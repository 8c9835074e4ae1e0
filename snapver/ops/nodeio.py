"""One node's write and undo, by the compare-and-swap rule.

The node takes its write lock, checks every expectation again before it writes anything
(a node that changed since the plan is refused untouched), stages every file, and then
renames each one into place only while its path still holds what was expected; it
removes stale bytecode and re-hashes what it wrote, and that re-hash is checked here. An
undo is the same rule the other way: a file is restored only while it still holds
exactly what was written; one changed since is left alone and reported.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

from snapver.config import NodeSpec
from snapver.errors import Cancelled, ConflictError, SnapverError, StoreError, TransportError
from snapver.model import LINK, Entry, Manifest
from snapver.ops.plan import CONFLICT, DELETE, WRITE, Live, NodePlan, Step, first_of, undo_steps
from snapver.store.repo import BIG_BLOB, Store
from snapver.transport.base import Transport
from snapver.transport.connect import open_transport

CHUNK = 1 << 20


def open_node(spec: NodeSpec) -> Transport:
    transport = open_transport(spec)
    try:
        transport.open()
    except BaseException:
        transport.close()
        raise
    return transport


def check_paths(transport: Transport, spec: NodeSpec, paths: list[str]) -> dict[str, Live | None]:
    """The live state of ``paths``; a path through a symlink (or otherwise unsafe) refuses,
    as a conflict does (exit 1): the node is reachable, its tree is what forbids writing."""
    reply = transport.call("check", tracked=list(spec.paths), files=paths)
    if reply["unsafe"]:
        first = sorted(reply["unsafe"].values())[0]
        raise ConflictError(f"{spec.name}: refused: {first}",
                              hint="snapver never writes through a symlink or outside the tracked paths")
    return {path: Live.of(state) for path, state in reply["states"].items()}


@dataclass
class WriteResult:
    """What one node's write did. ``error``: what stopped it after something may have been
    written (a conflict at the moment of writing, a failed write or re-hash): the caller
    undoes ``written`` and ``deleted``."""

    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytecode_removed: list[str] = field(default_factory=list)
    conflicts: dict[str, Any] = field(default_factory=dict)  # path -> {"expected", "found"}
    error: SnapverError | None = None


def describe_conflicts(conflicts: dict[str, Any], limit: int = 5) -> str:
    """``path (expected abc1234, found def5678)``, for the first ``limit`` paths."""
    def state(value: Any) -> str:
        if value is None:
            return "absent"
        if isinstance(value, list) and len(value) >= 2:
            return f"{'link ' if value[0] == LINK else ''}{str(value[1])[:10]}"
        return str(value)

    return first_of([f"{path} (expected {state(seen.get('expected'))}, found {state(seen.get('found'))})"
                     for path, seen in sorted(conflicts.items())], limit)


def write_node(store: Store, transport: Transport, spec: NodeSpec, steps: list[Step], partial: bool = False,
               abortable: bool = True, on_sent: Callable[[int], None] | None = None) -> WriteResult:
    """Write ``steps`` on one node and check the node's re-hash of every file it wrote.

    A path that is unsafe or (unless ``partial``) does not hold what the plan expects
    refuses the write with nothing written: ``error`` is set and nothing is listed as
    written. ``Cancelled`` is raised when interrupted while sending (``abortable``).
    ``partial`` (an undo): paths that do not hold what is expected are skipped, reported
    in ``conflicts``. ``on_sent(n)`` is called once the n-th file is sent (a test holds
    the write there).
    """
    todo = [s for s in steps if s.action in (WRITE, DELETE)]
    if not todo:
        return WriteResult()
    # A missing object is found out before the node is asked to write: once it has
    # accepted, it waits for every file's content.
    wanted = {s.target.oid for s in todo if s.action == WRITE and s.target is not None}
    missing = wanted - store.existing(wanted)
    if missing:
        raise StoreError(f"object {sorted(missing)[0]} is missing from the store; nothing was written",
                         hint="run `snapver fsck`")
    reply = transport.call("write", tracked=list(spec.paths), files=[s.wire() for s in todo], partial=partial)
    if reply.get("unsafe"):  # made unsafe since the plan (a folder swapped for a link): as a change since it
        return WriteResult(error=ConflictError(
            f"{spec.name}: refused: {sorted(reply['unsafe'].values())[0]}",
            hint="snapver never writes through a symlink or outside the tracked paths"))
    if reply.get("conflicts"):
        return WriteResult(error=ConflictError(
            f"{spec.name}: changed since the plan was made: {describe_conflicts(reply['conflicts'])}",
            hint="nothing was written there; run the command again to see the new plan"))
    skipped = set(reply.get("skipped") or ())
    sending = [s.target for s in todo if s.action == WRITE and s.target is not None and s.path not in skipped]
    contents = _contents(store, sending)
    try:
        for sent, pieces in enumerate(contents, 1):
            try:
                transport.send_stream(pieces, abortable=abortable)
            finally:
                pieces.close()
            if on_sent is not None:
                on_sent(sent)
    except Cancelled:
        raise  # the stream was abandoned in step (ABORT_FRAME): the session still serves
    except BaseException:
        # Any other end mid-stream (a blob unreadable half-way, a bug): the agent still
        # waits for the rest of the files, so the session is of no more use; an undo or
        # the after-snapshot opens a fresh one, and the agent drops what it staged.
        transport.abandon()
        raise
    finally:
        contents.close()
    done = transport.call("write_done")
    result = WriteResult(sorted(done.get("written") or {}), sorted(done.get("deleted") or {}),
                         list(done.get("bytecode_removed") or []),
                         {**(done.get("skipped") or {}), **(done.get("conflicts") or {})})
    if done.get("failure"):
        result.error = TransportError(f"{spec.name}: write failed: {done['failure']}")
    elif done.get("conflicts") and not partial:
        result.error = ConflictError(f"{spec.name}: changed while the push was writing: "
                                     f"{describe_conflicts(done['conflicts'])}",
                                     hint="that file was left as the other writer made it")
    written = done.get("written") or {}
    for step in todo:
        if step.action == WRITE and step.target is not None and step.path in written:
            got = Live.of(written.get(step.path))
            if got is None or not got.matches(step.target, with_mode=not step.keep_mode):
                result.error = result.error or TransportError(
                    f"{spec.name}: {step.path}: re-hash after writing does not match "
                    f"(wrote {step.target.oid[:10]}, found {got.oid[:10] if got and got.oid else got})")
        elif (done.get("deleted") or {}).get(step.path) is not None:
            result.error = result.error or TransportError(f"{spec.name}: {step.path}: still there after deleting it")
    return result


def _contents(store: Store, entries: list[Entry]) -> Generator[Generator[bytes, None, None], None, None]:
    """Each entry's content in turn, as pieces of at most ``CHUNK`` bytes, in bounded memory.

    A blob over ``BIG_BLOB`` streams from its own git process, never held whole. Smaller
    ones come from one batched read, taken as they are needed: one is held at a time,
    or longer while a later entry wants the same blob. Close each piece iterator when
    done with it, and this generator too.
    """
    small = [entry.oid for entry in entries if entry.size <= BIG_BLOB]
    wanted_again = Counter(small)
    batched = store.read_blobs(small)  # in order of first appearance, as they are needed below
    held: dict[str, bytes] = {}
    try:
        for entry in entries:
            if entry.size > BIG_BLOB:
                yield store.blob_chunks(entry.oid, CHUNK)
                continue
            if entry.oid not in held:
                oid, held[entry.oid] = next(batched, (None, b""))
                if oid != entry.oid:
                    raise StoreError(f"object {entry.oid} is missing from the store", hint="run `snapver fsck`")
            data = held[entry.oid]
            wanted_again[entry.oid] -= 1
            if not wanted_again[entry.oid]:
                del held[entry.oid]
            yield (data[i:i + CHUNK] for i in range(0, len(data), CHUNK))
    finally:
        batched.close()


def undo_node(store: Store, plan: NodePlan, wrote: dict[str, Entry | None], before: Manifest,
              on_sent: Callable[[int], None] | None = None) -> list[str]:
    """Put ``before`` back on the paths a write made ``wrote``, by the compare-and-swap rule
    (a fresh connection if the old one died); returns the paths left alone because they
    changed since they were written."""
    for attempt in range(2):
        if plan.transport is None or not plan.transport.is_open or attempt:
            plan.close()
            plan.transport = open_node(plan.spec)
        try:
            live = check_paths(plan.transport, plan.spec, list(wrote))
            steps = undo_steps(live, wrote, {path: before.get(path) for path in wrote})
            result = write_node(store, plan.transport, plan.spec, steps, partial=True, abortable=False,
                                on_sent=on_sent)
            if result.error is not None:
                raise result.error
            return sorted({s.path for s in steps if s.action == CONFLICT} | set(result.conflicts))
        except TransportError:
            if attempt:
                raise
    raise AssertionError("unreachable")


def left_alone_error(node: str, paths: list[str]) -> ConflictError:
    """The error for an undo that left files alone because they changed since written."""
    return ConflictError(f"{node}: {len(paths)} file(s) changed since they were written, left alone: "
                         f"{first_of(paths)}",
                         hint=f"see them with `snapver diff {node}`; `snapver rollback {node} --force` "
                              "restores them anyway")
