"""The one plan/apply path that push and rollback share.

A plan is, per node, the list of paths to write or delete, each with the state the
node had when planned (kind and git blob id) and the entry it should end up with. The
node takes its write lock, checks every expectation again before it writes anything (a
node that changed since the plan is refused untouched), stages every file, and then
renames each one into place only while its path still holds what was expected
(compare-and-swap at the write); it removes stale bytecode and re-hashes what it wrote,
and that re-hash is checked here. An undo (a failed node, an interrupt, a rollback of a
push) is the same rule the other way: a file is restored only while it still holds
exactly what was written; one changed since is left alone and reported.

Applying, under the store lock: snapshot each node (before), write a push record
("started") on ``refs/heads/pushes/<node>`` — so a push killed at any later moment is
visible and can be rolled back — then write the nodes in parallel, run the health
check, roll back failed nodes (and, unless ``keep_going``, the others), snapshot them
again (after) and mark each record with its final state.
"""

from __future__ import annotations

import heapq
import os
import re
import stat
import threading
import time
import uuid
from collections import Counter
from collections.abc import Generator
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Callable, Iterable

from snapver import interrupt
from snapver.config import NodeSpec
from snapver.errors import Cancelled, ConflictError, SnapverError, StoreError, TransportError
from snapver.model import FILE, LINK, SPECIAL, Entry, Manifest
from snapver.store import refs
from snapver.store.records import format_message, push_record_meta
from snapver.store.repo import BIG_BLOB, Commit, Store
from snapver.store.team import TeamView, commit_moment, writer_of
from snapver.transport.base import Transport
from snapver.transport.connect import open_transport

WRITE, DELETE, SKIP, CONFLICT = "write", "delete", "skip", "conflict"
CHUNK = 1 << 20
# Test hooks (documented in tests/ops/test_push.py): after sending this many files to a
# node, sleep SNAPVER_TEST_PAUSE_SECONDS (default an hour), so that a test can race or kill
# the push half-way; after a node is written, sleep this many seconds.
PAUSE_ENV = "SNAPVER_TEST_PAUSE_AFTER_FILES"
PAUSE_WRITTEN_ENV = "SNAPVER_TEST_PAUSE_AFTER_WRITE"
MAX_PARALLEL = 16


@dataclass(frozen=True)
class Live:
    """A path as a node holds it now: kind ("f", "l" or "other"), git blob id, st_mode."""

    kind: str
    oid: str | None
    mode: int

    @classmethod
    def of(cls, state: list[Any] | None) -> "Live | None":
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


def restore_steps(live: dict[str, Live | None], target: dict[str, Entry | None]) -> list[Step]:
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
               abortable: bool = True) -> WriteResult:
    """Write ``steps`` on one node and check the node's re-hash of every file it wrote.

    A path that is unsafe or (unless ``partial``) does not hold what the plan expects
    refuses the write with nothing written: ``error`` is set and nothing is listed as
    written. ``Cancelled`` is raised when interrupted while sending (``abortable``).
    ``partial`` (an undo): paths that do not hold what is expected are skipped, reported
    in ``conflicts``.
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
    pause = int(os.environ.get(PAUSE_ENV) or 0)
    contents = _contents(store, sending)
    try:
        for sent, pieces in enumerate(contents, 1):
            try:
                transport.send_stream(pieces, abortable=abortable)
            finally:
                pieces.close()
            if pause and sent == pause:
                interrupt.pause(float(os.environ.get("SNAPVER_TEST_PAUSE_SECONDS") or 3600))
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


def undo_node(store: Store, plan: NodePlan, wrote: dict[str, Entry | None], before: Manifest) -> list[str]:
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
            result = write_node(store, plan.transport, plan.spec, steps, partial=True, abortable=False)
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


def hook_deadline(spec: NodeSpec, timeout: float) -> float:
    """How long the client waits for the reply to a hook the agent bounds to ``timeout``:
    that, plus the link's time and the agent's own ending of what timed out."""
    return timeout + spec.connect_timeout + 10


def run_health(transport: Transport, spec: NodeSpec, command: str, timeout: float) -> str:
    """Run the health check on the node; a failure (exit code, timeout) raises."""
    reply = transport.call_within(hook_deadline(spec, timeout), "run", command=command, timeout=timeout)
    output = reply.get("output", "").strip()
    if reply.get("timed_out") or reply.get("code") != 0:
        why = f"timed out after {timeout:g} s" if reply.get("timed_out") else f"exit {reply.get('code')}"
        tail = output.splitlines()[-1] if output else "no output"
        raise TransportError(f"{spec.name}: health check failed ({why}): {tail}", hint=f"command: {command}")
    return output


@dataclass(frozen=True)
class Hooks:
    """What to run on a node after writing it: ``restart`` (sh), then wait until healthy:
    ``health`` (sh, exit 0) and ``health_url`` (polled from the node, 2xx), within
    ``timeout`` seconds each."""

    restart: str | None = None
    health: str | None = None
    health_url: str | None = None
    timeout: float = 300.0

    def __bool__(self) -> bool:
        return bool(self.restart or self.health or self.health_url)

    def to_json(self) -> dict[str, Any]:
        return {"restart": self.restart, "health": self.health, "health_url": self.health_url,
                "timeout": self.timeout}


def poll_health_url(transport: Transport, spec: NodeSpec, url: str, timeout: float) -> str:
    """Poll ``url`` from the node until 2xx or ``timeout``; a failure raises."""
    reply = transport.call_within(hook_deadline(spec, timeout), "health_url", url=url, timeout=timeout)
    if not reply.get("ok"):
        raise TransportError(f"{spec.name}: health URL {url} not healthy within {timeout:g} s: "
                             f"{reply.get('last')} ({reply.get('attempts')} attempt(s))")
    return f"{url} answered {reply.get('status')}"


def run_hooks(transport: Transport, spec: NodeSpec, hooks: Hooks, log: list[str]) -> None:
    """Restart, then wait until healthy; each step's outcome is appended to ``log``; the
    first failure raises (a restart that exits non-zero, hangs, or ends the session)."""
    if hooks.restart:
        reply = transport.run_restart(hooks.restart, hooks.timeout, hook_deadline(spec, hooks.timeout))
        output = (reply.get("output") or "").strip()
        if reply.get("timed_out") or reply.get("code") != 0:
            why = f"timed out after {hooks.timeout:g} s" if reply.get("timed_out") else f"exit {reply.get('code')}"
            tail = output.splitlines()[-1] if output else "no output"
            raise TransportError(f"{spec.name}: restart failed ({why}): {tail}", hint=f"command: {hooks.restart}")
        log.append("restarted")
    if hooks.health:
        run_health(transport, spec, hooks.health, hooks.timeout)
        log.append("health check passed")
    if hooks.health_url:
        log.append(poll_health_url(transport, spec, hooks.health_url, hooks.timeout))


def _hooks_again(plan: "NodePlan", hooks: Hooks, log: list[str]) -> SnapverError | None:
    """After an undo: restart on the restored code and wait until healthy (a fresh
    connection if the old one died); returns what failed, if anything."""
    try:
        if plan.transport is None or not plan.transport.is_open:
            plan.close()
            plan.transport = open_node(plan.spec)
        run_hooks(plan.transport, plan.spec, hooks, log)
    except SnapverError as exc:
        if plan.transport is not None and not plan.transport.is_open:
            plan.close()
        return exc
    return None


# -- push records ------------------------------------------------------------------------
@dataclass(frozen=True)
class PushState:
    """What the newest push record of a node says."""

    node: str
    record: str
    action: str
    state: str
    patch: str | None
    time: datetime
    before: str | None
    restore: str | None
    after: str | None
    running: bool = False
    waves: str | None = None  # "stopped after 1 of 2 wave(s) (1,100%)" for a push in waves that stopped
    writer: str | None = None  # who wrote the record, in a team store (None: this store alone)

    @property
    def interrupted(self) -> bool:
        """A push or rollback that began writing and never finished (not running now)."""
        return self.state == "started" and not self.running

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "record": self.record, "action": self.action, "state": self.state,
                "patch": self.patch, "time": self.time.isoformat(), "before": self.before,
                "restore": self.restore, "after": self.after, "running": self.running,
                "interrupted": self.interrupted, "waves": self.waves, "writer": self.writer}


def _state_of(node: str, commit: Commit, running: bool = False, writer: str | None = None) -> PushState:
    meta = commit.meta
    return PushState(node, commit.id, meta.get("action", "push"), meta.get("state", "?"), meta.get("patch"),
                     commit.time.astimezone(), meta.get("before"), meta.get("restore") or meta.get("before"),
                     meta.get("after"), running, _waves_note(meta), writer)


def _waves_note(meta: dict[str, Any]) -> str | None:
    """What a record of a push in waves says of where it stopped (None: not in waves, or
    its node's wave finished)."""
    if not meta.get("waves") or meta.get("state") == "done":
        return None
    return (f"the {meta.get('action', 'push')} stopped after {meta.get('waves_finished', 0)} of "
            f"{meta.get('of_waves', '?')} wave(s) ({meta['waves']})")


def _ledger(store: Store, node: str, per_writer: int | None = None,
            notes: list[str] | None = None) -> tuple[list[tuple[str, Commit]], TeamView]:
    """Every writer's push records of ``node``, newest first, each with its writer: the
    namespace it was read from, never a field of the record (a namespace is the one thing a
    writer cannot forge). A record in another writer's namespace claiming someone else
    wrote it is left out, and said in ``notes``. ``per_writer``: read at most that many of
    each writer's records."""
    view = TeamView(store)
    chains = []
    refused: list[tuple[str, Commit]] = []
    # Higher writer ids first: on equal times heapq.merge keeps the earlier list's first (as newest()).
    for writer, tip in sorted(view.by_writer(refs.PUSHES).get(node, {}).items(), reverse=True):
        chain = []
        # First parents only: a writer's ledger is one line of its own records; whatever a
        # record names as a further parent is no record of theirs.
        for commit in store.commits([tip], limit=per_writer, first_parent=True):
            claimed = commit.meta.get("writer")
            if writer != view.me and claimed is not None and claimed != writer:
                refused.append((writer, commit))
            else:
                chain.append((writer, commit))
        chains.append(chain)
    accepted = {commit.id for chain in chains for _, commit in chain}
    for writer, commit in refused:
        if notes is not None and commit.id not in accepted:  # a copy of a real record (its writer's) is no news
            notes.append(f"ignored push record {commit.id[:10]} of {node} published by {writer!r}: "
                         f"it claims to be {commit.meta.get('writer')!r}'s")
    return list(heapq.merge(*chains, key=lambda item: -commit_moment(item[1]))), view


def _shown_writer(view: TeamView, writer: str) -> str | None:
    return writer if view.is_team else None


def newest_record(store: Store, node: str, check_lock: bool = True) -> PushState | None:
    """The node's newest push record (of any writer); ``running`` if it is "started", ours
    and the store is locked."""
    ledger, view = _ledger(store, node, per_writer=1)
    if not ledger:
        return None
    writer, commit = ledger[0]
    # A shared-lock probe: the threads of one command (status of several nodes) never take
    # each other's probe for a running push.
    running = check_lock and writer == view.me and commit.meta.get("state") == "started" and store.is_locked()
    return _state_of(node, commit, running, _shown_writer(view, writer))


_COMMIT_ID = re.compile(r"[0-9a-f]{40}")


def in_node_history(view: TeamView, node: str, commit: str) -> bool:
    """True when ``commit`` is a snapshot of ``node``: in any writer's branch of it, or an
    import kept beside it (what `log NODE` lists)."""
    if not isinstance(commit, str) or not _COMMIT_ID.fullmatch(commit):
        return False  # a record's field, never handed to git as anything but an id
    heads = set(view.by_writer(refs.NODES).get(node, {}).values()) | set(view.under(refs.IMPORTS + node + "/").values())
    return any(view.contains(head, commit) for head in sorted(heads))


def last_push(store: Store, node: str, notes: list[str] | None = None) -> PushState | None:
    """The newest push that changed the node and was not undone (by its own failure
    handling), by any writer; its ``restore`` is the state before it. A record whose restore
    point is no snapshot of the node is passed over (said in ``notes``): undoing it would
    write a tree that node never had."""
    ledger, view = _ledger(store, node, notes=notes)
    seen: set[str] = set()
    for writer, commit in ledger:
        push_id = commit.meta.get("push_id", commit.id)
        if push_id in seen:
            continue
        seen.add(push_id)
        if commit.meta.get("action") == "push" and commit.meta.get("state") in ("done", "started", "failed"):
            pushed = _state_of(node, commit, writer=_shown_writer(view, writer))
            if not pushed.restore or in_node_history(view, node, pushed.restore):
                return pushed
            if notes is not None:
                notes.append(f"ignored push record {commit.id[:10]} of {node} published by {writer!r}: its "
                             f"restore point {str(pushed.restore)[:10]} is not a snapshot of {node}")
    return None


@dataclass
class Record:
    """What a push record says besides its node and state."""

    action: str  # "push" | "rollback"
    subject: str
    meta: dict[str, Any]
    push_id: str = field(default_factory=lambda: uuid.uuid4().hex[:16])
    per_node: dict[str, dict[str, Any]] = field(default_factory=dict)  # meta of one node's records only


def write_records(store: Store, record: Record, rows: list[dict[str, Any]]) -> dict[str, str]:
    """Append one record per row (``node``, ``state``, ``tree`` commit, extra meta) in one
    store write; returns ``{node: record commit}``."""
    now = datetime.now(timezone.utc)
    marks = {}
    writer = writer_of(store)  # the ledger says who (a team store's push records are everyone's)
    with store.importer() as importer:
        for row in rows:
            node = row["node"]
            meta = push_record_meta({**record.meta, **record.per_node.get(node, {}),
                                     **{k: v for k, v in row.items() if k != "tree"}},
                                    writer=writer, action=record.action, push_id=record.push_id, when=now)
            manifest = store.manifest(row["tree"]) if row.get("tree") else Manifest()
            subject = f"{record.subject} on {node}: {row['state']}"
            marks[node] = importer.commit(refs.push_ref(node), store.ref(refs.push_ref(node)), manifest,
                                          format_message(subject, meta), now)
    return {node: importer.results[mark] for node, mark in marks.items()}


# -- applying ----------------------------------------------------------------------------
@dataclass
class NodeRun:
    """What applying one node's plan did."""

    node: str
    state: str = "not-started"  # done | rolled-back | failed | cancelled
    before: str | None = None
    after: str | None = None
    record: str | None = None
    written: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    bytecode_removed: list[str] = field(default_factory=list)
    health: str | None = None
    error: SnapverError | None = None
    rollback_error: SnapverError | None = None
    seconds: float = 0.0
    hooks_log: list[str] = field(default_factory=list)  # restart and health, after writing
    recovery_log: list[str] = field(default_factory=list)  # the same, on the restored code after an undo
    recovery_error: SnapverError | None = None
    hooks_started: bool = False  # the restart may have run: an undo restarts again

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return self.error.exit_code
        return 0 if self.state == "done" else 1

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "state": self.state, "before": self.before, "after": self.after,
                "record": self.record, "written": self.written, "deleted": self.deleted,
                "bytecode_removed": self.bytecode_removed, "health": self.health,
                "error": str(self.error) if self.error else None,
                "rollback_error": str(self.rollback_error) if self.rollback_error else None,
                "hooks": self.hooks_log, "recovery": self.recovery_log,
                "recovery_error": str(self.recovery_error) if self.recovery_error else None,
                "seconds": round(self.seconds, 3)}


def _snapshot(store: Store, plans: list[NodePlan],
              event: dict[str, str] | None = None) -> dict[str, str | SnapverError]:
    """Snapshot the plans' nodes, over the connections they already have open (``event``:
    what made the snapshots, see ``pull_locked``)."""
    from snapver.ops.pull import pull_locked

    found: dict[str, str | SnapverError] = {}
    opened = {p.node: p.transport for p in plans if p.transport is not None}
    # The content the plans write: its digests are known, no need to read it back.
    written = {s.target.oid: s.target.digest for p in plans for s in p.writes if s.target is not None}
    for result in pull_locked(store, [p.spec for p in plans], open_transports=opened, known_digests=written,
                              event=event).nodes:
        head = result.snapshot or result.unchanged_since
        found[result.node] = result.error or head or StoreError(f"{result.node}: no snapshot was recorded")
    return found


def execute(store: Store, plans: list[NodePlan], record: Record, health: str | None = None,
            health_timeout: float = 300.0, keep_going: bool = False, undo_failed: bool = True,
            on_node: Callable[[NodeRun], None] | None = None,
            hooks: dict[str, Hooks] | None = None, after_interrupt: bool = False) -> list[NodeRun]:
    """Apply every plan that has writes (see the module docstring for the order).

    ``hooks`` (per node): after the write, restart and wait until healthy; a failure
    rolls the node back like a failed health check, then restarts it on the restored
    code (``recovery_log``, ``recovery_error``). A node rolled back because another
    failed is restarted on its restored code too.

    An interrupt (Ctrl-C, SIGTERM) stops the nodes still sending (nothing is committed
    there: ``cancelled``), undoes by the compare-and-swap rule the nodes already written,
    records the outcome and returns; the caller then raises the interrupt.
    ``after_interrupt``: an undo of what an interrupted command wrote, run in full.
    """
    busy = [p for p in plans if p.writes]
    runs = {p.node: NodeRun(p.node) for p in busy}
    if not busy:
        return []
    with store.lock():
        before = _snapshot(store, busy)
        failed = {node: v for node, v in before.items() if isinstance(v, SnapverError)}
        if failed:
            node, error = sorted(failed.items())[0]
            raise type(error)(f"cannot snapshot {node} before writing, so nothing was written: {error.message}",
                              hint=error.hint)
        rows = []
        for plan in busy:
            prior = newest_record(store, plan.node, check_lock=False)
            carried = prior is not None and prior.state in ("started", "failed")
            rows.append({"node": plan.node, "state": "started", "tree": before[plan.node],
                         "before": before[plan.node],
                         "restore": prior.restore if carried and prior else before[plan.node],
                         "files": _files_meta(plan)})
            runs[plan.node].before = str(before[plan.node])
        started = write_records(store, record, rows)
        for node, commit in started.items():
            runs[node].record = commit
        restore_of = {row["node"]: row["restore"] for row in rows}
        wrote_of = {p.node: {s.path: s.target if s.action == WRITE else None for s in p.writes} for p in busy}
        stop = threading.Event()
        undone: set[str] = set()
        answered: set[str] = set()  # nodes whose write reply came: they wrote exactly run.written/deleted

        def apply(plan: NodePlan) -> None:
            run = runs[plan.node]
            began = time.monotonic()
            if (stop.is_set() and not keep_going) or (interrupt.requested() and not after_interrupt):
                return
            try:
                if plan.transport is None:
                    plan.transport = open_node(plan.spec)
                result = write_node(store, plan.transport, plan.spec, plan.steps, abortable=not after_interrupt)
                run.written, run.deleted, run.bytecode_removed = result.written, result.deleted, result.bytecode_removed
                answered.add(plan.node)
                if result.error is not None:
                    raise result.error
                if os.environ.get(PAUSE_WRITTEN_ENV):
                    interrupt.pause(float(os.environ[PAUSE_WRITTEN_ENV]))
                if health:
                    run.health = run_health(plan.transport, plan.spec, health, health_timeout)
                if hooks and hooks.get(plan.node):
                    run.hooks_started = True
                    run_hooks(plan.transport, plan.spec, hooks[plan.node], run.hooks_log)
                run.state = "done"
            except Cancelled as exc:
                run.error, run.state = exc, "cancelled"  # stopped while sending: nothing committed there
            except SnapverError as exc:
                run.error, run.state = exc, "failed"
                stop.set()
                if undo_failed and not interrupt.requested():
                    undo(plan)
            finally:
                run.seconds = time.monotonic() - began

        def undo(plan: NodePlan) -> None:
            run = runs[plan.node]
            undone.add(plan.node)
            wrote = wrote_of[plan.node]
            if plan.node in answered:  # else (a connection lost mid-write) any planned path may be written
                wrote = {path: wrote[path] for path in run.written + run.deleted}
            try:
                left = undo_node(store, plan, wrote, store.manifest(str(run.before))) if wrote else []
            except SnapverError as exc:
                run.rollback_error, run.state = exc, "failed"
                return
            if left:
                run.rollback_error, run.state = left_alone_error(plan.node, left), "failed"
            else:
                run.state = "rolled-back"
            node_hooks = (hooks or {}).get(plan.node)
            if node_hooks and node_hooks.restart and run.hooks_started and not interrupt.requested():
                run.recovery_error = _hooks_again(plan, node_hooks, run.recovery_log)

        interrupted = False
        with interrupt.deferred(), ThreadPoolExecutor(min(MAX_PARALLEL, len(busy))) as pool:
            futures = {pool.submit(apply, plan): plan for plan in busy}
            try:
                while wait(futures, timeout=0.2).not_done:
                    pass
            except KeyboardInterrupt:
                interrupted = True
                _stop_in_order(futures)
            if interrupted or (stop.is_set() and not keep_going):
                again = [p for p in busy if p.node not in undone and (runs[p.node].state == "done" or (
                    interrupted and runs[p.node].state == "failed"))]
                list(pool.map(undo, again))
            touched = [p for p in busy if runs[p.node].state != "not-started" or runs[p.node].error]
            for plan in touched:
                if plan.transport is not None and not plan.transport.is_open:
                    plan.close()  # cut by the interrupt: the snapshot connects again
            made_by = {"event": record.action, **({"patch": record.meta["patch"]} if record.meta.get("patch") else {})}
            after = _snapshot(store, touched, made_by) if touched else {}
        rows = []
        for plan in busy:
            run = runs[plan.node]
            snap = after.get(plan.node)
            run.after = snap if isinstance(snap, str) else None
            if run.state == "not-started":
                run.state = "cancelled"  # another node failed first, or an interrupt: never written
            errors = [str(e) for e in (run.error, run.rollback_error, snap) if isinstance(e, SnapverError)]
            rows.append({"node": plan.node, "state": run.state, "tree": run.after or run.before,
                         "before": run.before, "after": run.after, "restore": restore_of[plan.node],
                         "files": _files_meta(plan), "written": len(run.written), "deleted": len(run.deleted),
                         "bytecode_removed": len(run.bytecode_removed), "interrupted": interrupted,
                         "error": "; ".join(errors) or None})
        try:
            finished = write_records(store, record, rows)
        except StoreError as exc:
            patched = [n for n, r in runs.items() if r.state == "done" or (r.state == "failed" and r.written)]
            if not patched:
                raise
            raise StoreError(f"{exc.message}; {', '.join(patched)} {'was' if len(patched) == 1 else 'were'} "
                             "written, but the push's outcome could not be recorded (its record says started)",
                             hint=f"make room for the store, then `snapver rollback {patched[0]}` restores "
                                  "it") from exc
        for node, commit in finished.items():
            runs[node].record = commit
    for plan in busy:
        if on_node:
            on_node(runs[plan.node])
    return [runs[p.node] for p in busy]


def _stop_in_order(futures: dict[Future[None], NodePlan]) -> None:
    """After an interrupt: nodes still sending stop by themselves at their next piece; any
    still busy a moment later (waiting for a reply) have their connection cut."""
    if wait(futures, timeout=interrupt.GRACE).not_done:
        busy = [futures[f] for f in futures if not f.done()]
        interrupt.cut_all([plan.transport for plan in busy if plan.transport is not None])
        wait(futures, timeout=10)


def _files_meta(plan: NodePlan) -> dict[str, list[str]]:
    files: dict[str, list[str]] = {}
    for step in plan.steps:
        key = "forced" if step.forced else step.action
        files.setdefault(key, []).append(step.path)
    return files
