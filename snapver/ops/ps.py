"""ps: the processes on each node that run code of its tracked tree, and which of them
started before a tracked file they may run last changed (restart needed).

The node's agent reads ``/proc`` (``op_ps`` in ``transport/agent.py``): a process is
listed when it maps a file of the tree (an extension module), or is a Python that can
import the tree (the interpreter of the prefix owning site-packages, site-packages on
its ``PYTHONPATH`` or as its working folder). A mapped file replaced since the process
started is certain old code; a ``.py`` changed (ctime) since it started "may run old
code" (Python may not have imported it yet). Secret-looking command-line values are
masked on the node. Processes that cannot be read are counted and named.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any, Iterable

from snapver.config import NodeSpec
from snapver.errors import SnapverError, TransportError
from snapver.transport.base import Transport
from snapver.transport.connect import open_transport

MAX_PARALLEL = 16


@dataclass(frozen=True)
class StaleFile:
    """A tracked file a process may still run an older version of."""

    path: str
    certain: bool  # a mapped file replaced since the process started
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "certain": self.certain, "why": self.why}


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

    @property
    def restart_needed(self) -> bool:
        return bool(self.files)

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "user": self.user, "command": self.command,
                "started": self.started.isoformat(timespec="seconds"), "restart_needed": self.restart_needed,
                "certain": any(f.certain for f in self.files), "files": [f.path for f in self.files],
                "files_detail": [f.to_json() for f in self.files], "files_more": self.files_more,
                "reasons": list(self.reasons)}


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
        return self.error.exit_code if self.error is not None else 0

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


def processes_of(transport: Transport, spec: NodeSpec) -> NodeProcesses:
    """Ask an open node's agent for its processes (see the module docstring)."""
    reply = transport.call("ps", paths=list(spec.paths), exclude=list(spec.exclude))
    try:
        processes = [NodeProcess(
            pid=int(row["pid"]), user=str(row["user"]), command=str(row["command"]), started=_when(row["started_ns"]),
            reasons=tuple(row["reasons"]),
            files=tuple(StaleFile(f["path"], bool(f["certain"]), f["why"]) for f in row["files"]),
            files_more=int(row.get("files_more") or 0)) for row in reply["processes"]]
        return NodeProcesses(spec.name, processes, int(reply["unreadable"]),
                             [(int(p), str(n), str(w)) for p, n, w in reply["unreadable_named"]],
                             str(reply.get("hidepid") or ""))
    except (KeyError, TypeError, ValueError) as exc:
        raise TransportError(f"{spec.name}: malformed reply from the agent to ps: {exc!r}") from None


def _one(spec: NodeSpec) -> NodeProcesses:
    try:
        with open_transport(spec) as transport:
            return processes_of(transport, spec)
    except SnapverError as exc:
        return NodeProcesses(spec.name, error=exc)


def ps(specs: list[NodeSpec]) -> PsResult:
    """The processes of every node in ``specs``, asked in parallel."""
    with ThreadPoolExecutor(max(1, min(MAX_PARALLEL, len(specs)))) as pool:
        return PsResult(list(pool.map(_one, specs)))


def running_old(found: NodeProcesses, paths: Iterable[str]) -> list[NodeProcess]:
    """The processes that may still run an older version of one of ``paths`` (the files a
    push or rollback just wrote)."""
    wanted = set(paths)
    return [p for p in found.processes if any(f.path in wanted for f in p.files)]


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


def stale_after_write(plans: list[Any], runs: list[Any]) -> list[StaleAfterWrite]:
    """For each node ``runs`` says was written (done or rolled back), the processes that
    started before the files it wrote last changed. Uses the plan's connection while it is
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
            found = processes_of(transport, plan.spec)
        except SnapverError as exc:
            return StaleAfterWrite(run.node, error=exc)
        return StaleAfterWrite(run.node, running_old(found, list(run.written) + list(run.deleted)), found)

    if not written:
        return []
    with ThreadPoolExecutor(max(1, min(MAX_PARALLEL, len(written)))) as pool:
        return list(pool.map(one, written))
