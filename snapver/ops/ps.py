"""ps: the processes on each node that run code of its tracked tree, and which of them
may run code that differs from the files there now (restart needed).

The node's agent reads ``/proc`` (``op_ps`` in ``transport/agent/procs.py``): a process is
listed when it maps or holds open a file of the tree, or is a Python that can import the
tree (the interpreter of the prefix owning site-packages, by its binary or the libpython
it maps; for an editable or source install, the node's Python that finds the tree there;
one that maps extension modules from site-packages, as a process renamed with
setproctitle or ``exec -a`` still does; site-packages on its ``PYTHONPATH`` or as its
working folder). snapver's own processes (agents, compaction, mux, CLI) are recognised by
their command line and never listed.

A change is judged by content: the node's newest snapshot taken at or before a process
started holds the tree it imported; a module whose blob differs now, or that was added
or removed since, is a reason to restart ("may run old code": Python may not have imported
it yet); a mapped file replaced since it started is certain, unless its bytes are the
same. When no snapshot covers the start, the agent's ctime verdict stands. Secret-looking
command-line values are masked on the node. Processes that cannot be read are counted.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from snapver.config import NodeSpec
from snapver.errors import SnapverError, TransportError
from snapver.model import Manifest
from snapver.store import refs
from snapver.store.repo import Store
from snapver.store.team import commit_moment
from snapver.transport.base import Transport
from snapver.transport.connect import open_transport

MAX_PARALLEL = 16


@dataclass(frozen=True)
class StaleFile:
    """A tracked file a process may still run an older version of."""

    path: str
    certain: bool  # a mapped file replaced since the process started
    why: str
    same_content: bool = False  # replaced by the same bytes: said, never a reason to restart

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "certain": self.certain, "why": self.why, "same_content": self.same_content}


@dataclass(frozen=True)
class NodeProcess:
    """One process that runs code of the tracked tree."""

    pid: int
    user: str
    command: str  # secret-looking values masked on the node
    started: datetime
    reasons: tuple[str, ...]
    files: tuple[StaleFile, ...] = ()
    files_more: int = 0
    mapped: tuple[str, ...] = ()  # files of the tree it maps
    judged_by: str = "ctime"  # "content" (against the snapshot at its start) or "ctime" (none covers it)

    @property
    def restart_needed(self) -> bool:
        return any(not f.same_content for f in self.files) or self.files_more > 0

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "user": self.user, "command": self.command,
                "started": self.started.isoformat(timespec="seconds"), "restart_needed": self.restart_needed,
                "certain": any(f.certain for f in self.files), "files": [f.path for f in self.files],
                "files_detail": [f.to_json() for f in self.files], "files_more": self.files_more,
                "reasons": list(self.reasons), "mapped": list(self.mapped), "judged_by": self.judged_by}


@dataclass
class NodeProcesses:
    """What one node's ``/proc`` says (or why it could not be asked)."""

    node: str
    processes: list[NodeProcess] = field(default_factory=list)
    unreadable: int = 0
    unreadable_named: list[tuple[int, str, str]] = field(default_factory=list)  # pid, name, why
    hidepid: str = ""
    error: SnapverError | None = None

    @property
    def needing_restart(self) -> list[NodeProcess]:
        return [p for p in self.processes if p.restart_needed]

    @property
    def exit_code(self) -> int:
        """The error's code; else 1 when a process needs a restart (as `diff`), else 0."""
        if self.error is not None:
            return self.error.exit_code
        return 1 if self.needing_restart else 0

    def warnings(self) -> list[str]:
        """What the listing may miss: unreadable processes, a /proc hiding others' processes."""
        notes = []
        if self.unreadable:
            named = ", ".join(f"{pid} ({name})" for pid, name, _ in self.unreadable_named[:10])
            more = f" and {self.unreadable - 10} more" if self.unreadable > 10 else ""
            notes.append(f"{self.node}: {self.unreadable} process(es) could not be read (not listed, may run the "
                         f"tree): pid {named}{more}")
        if self.hidepid:
            notes.append(f"{self.node}: /proc is mounted with {self.hidepid}: processes of other users are hidden "
                         "from the SSH user and not listed")
        return notes

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "processes": [p.to_json() for p in self.processes],
                "restart_needed": len(self.needing_restart), "unreadable": self.unreadable,
                "unreadable_named": [{"pid": pid, "name": name, "why": why}
                                     for pid, name, why in self.unreadable_named],
                "hidepid": self.hidepid or None, "error": str(self.error) if self.error else None}


@dataclass
class PsResult:
    nodes: list[NodeProcesses]

    @property
    def exit_code(self) -> int:
        return max((n.exit_code for n in self.nodes), default=0)

    def to_json(self) -> dict[str, Any]:
        return {"nodes": [n.to_json() for n in self.nodes], "exit_code": self.exit_code}


def _when(ns: int) -> datetime:
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).astimezone()


def processes_of(transport: Transport, spec: NodeSpec, store: Store | None = None) -> NodeProcesses:
    """Ask an open node's agent for its processes (see the module docstring); with a
    ``store``, each process's files are judged by content against the node's history."""
    asked_ns = time.time_ns()
    reply = transport.call("ps", paths=list(spec.paths), exclude=list(spec.exclude))
    # The node's clock against ours (to within the round trip): process start times are the
    # node's, snapshot times this machine's.
    skew_ns = int(reply.get("now_ns") or 0) - (asked_ns + time.time_ns()) // 2 if reply.get("now_ns") else 0
    try:
        modules = {str(rel): (int(ctime), oid if isinstance(oid, str) else None)
                   for rel, (ctime, oid) in (reply.get("modules") or {}).items()}
        history = _History(store, spec.name) if store is not None and modules else None
        processes = [_process(row, modules, history, skew_ns) for row in reply["processes"]]
        return NodeProcesses(spec.name, processes, int(reply["unreadable"]),
                             [(int(p), str(n), str(w)) for p, n, w in reply["unreadable_named"]],
                             str(reply.get("hidepid") or ""))
    except (KeyError, TypeError, ValueError) as exc:
        raise TransportError(f"{spec.name}: malformed reply from the agent to ps: {exc!r}") from None


def _process(row: dict[str, Any], modules: dict[str, tuple[int, str | None]], history: _History | None,
             skew_ns: int) -> NodeProcess:
    """One listed process, its files judged by content when a snapshot covers its start."""
    started_ns = int(row["started_ns"])
    by_ctime = tuple(StaleFile(f["path"], bool(f["certain"]), f["why"]) for f in row["files"])
    base = NodeProcess(pid=int(row["pid"]), user=str(row["user"]), command=str(row["command"]),
                       started=_when(started_ns), reasons=tuple(row["reasons"]), files=by_ctime,
                       files_more=int(row.get("files_more") or 0), mapped=tuple(row.get("mapped") or ()))
    then = history.at(started_ns - skew_ns) if history is not None else None
    if then is None:
        return base
    replaced = {rel for rel, detail in (row.get("mapped_detail") or {}).items() if detail.get("replaced")}
    files = stale_by_content(then, modules, started_ns, replaced)
    return dataclasses.replace(base, files=tuple(files), files_more=0, judged_by="content")


MODULE_SUFFIXES = (".py", ".so", ".pyd")


def stale_by_content(then: Manifest, modules: dict[str, tuple[int, str | None]], started_ns: int,
                     replaced: set[str]) -> list[StaleFile]:
    """The modules that differ from what they held when a process started (``then``: the
    tree at its start; ``modules``: ``{path: (ctime_ns, blob id)}`` now, the blob id known
    for those changed since; ``replaced``: the mapped files replaced since). Pure."""
    files = []
    for path in sorted(set(modules) | {p for p in then.entries if p.endswith(MODULE_SUFFIXES)}):
        old = then.get(path)
        now = modules.get(path)
        if now is None:
            files.append(StaleFile(path, path in replaced, "removed since it started"))
        elif path in replaced:
            if old is not None and now[1] == old.oid:
                files.append(StaleFile(path, False, "replaced by the same bytes since it started (the old file "
                                       "is still mapped): no restart needed", same_content=True))
            else:
                files.append(StaleFile(path, True, "mapped, replaced since it started"))
        elif now[0] <= started_ns:
            continue  # unchanged since it started: what it imported is what is there
        elif old is None:
            files.append(StaleFile(path, False, "added since it started: may run old code"))
        elif now[1] != old.oid:
            files.append(StaleFile(path, False, "changed since it started: may run old code"))
    return files


class _History:
    """A node's snapshots (not imports: a folder dated by hand is no moment of the node),
    oldest first, read once: the tree at a moment is the newest taken at or before it."""

    def __init__(self, store: Store, node: str) -> None:
        self.store = store
        head = store.ref(refs.node_ref(node))
        commits = store.commits([head]) if head else []
        self.moments = sorted((commit_moment(c), c.id) for c in commits
                              if c.meta.get("kind") == "snapshot" and c.meta.get("event") != "import")

    def at(self, moment_ns: int) -> Manifest | None:
        found = [commit for when, commit in self.moments if when <= moment_ns]
        return self.store.manifest(found[-1]) if found else None


def _one(spec: NodeSpec, store: Store | None) -> NodeProcesses:
    try:
        with open_transport(spec) as transport:
            return processes_of(transport, spec, store)
    except SnapverError as exc:
        return NodeProcesses(spec.name, error=exc)


def ps(specs: list[NodeSpec], store: Store | None = None) -> PsResult:
    """The processes of every node in ``specs``, asked in parallel (judged by content
    against the nodes' snapshots in ``store``, when there is one)."""
    with ThreadPoolExecutor(max(1, min(MAX_PARALLEL, len(specs)))) as pool:
        return PsResult(list(pool.map(lambda spec: _one(spec, store), specs)))


def running_old(found: NodeProcesses, paths: Iterable[str]) -> list[NodeProcess]:
    """The processes that may still run an older version of one of ``paths`` (the files a
    push or rollback just wrote)."""
    wanted = set(paths)
    return [p for p in found.processes if any(f.path in wanted and not f.same_content for f in p.files)]


@dataclass
class StaleAfterWrite:
    """After a push or rollback wrote a node: the processes that may still run the code
    from before it, or why they could not be listed."""

    node: str
    processes: list[NodeProcess] = field(default_factory=list)
    listed: NodeProcesses | None = None
    error: SnapverError | None = None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "processes": [p.to_json() for p in self.processes],
                "error": str(self.error) if self.error else None}


def stale_after_write(plans: list[Any], runs: list[Any], store: Store | None = None) -> list[StaleAfterWrite]:
    """For each node ``runs`` says was written (done or rolled back), the processes that may
    run an older version of a file it wrote (judged as ``processes_of`` does). Uses the plan's connection while it is
    open, else a new one; a node that cannot be asked says why (the write stands)."""
    by_node = {plan.node: plan for plan in plans}
    written = [run for run in runs if run.state in ("done", "rolled-back") and (run.written or run.deleted)]

    def one(run: Any) -> StaleAfterWrite:
        plan = by_node[run.node]
        try:
            transport = plan.transport
            if transport is None or not transport.is_open:
                plan.close()
                transport = plan.transport = open_transport(plan.spec)
                transport.open()
            found = processes_of(transport, plan.spec, store)
        except SnapverError as exc:
            return StaleAfterWrite(run.node, error=exc)
        return StaleAfterWrite(run.node, running_old(found, list(run.written) + list(run.deleted)), found)

    if not written:
        return []
    with ThreadPoolExecutor(max(1, min(MAX_PARALLEL, len(written)))) as pool:
        return list(pool.map(one, written))
