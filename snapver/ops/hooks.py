"""Restart and health: what runs on a node after it is written (or restored).

``Hooks`` per node says what to run: ``restart`` (sh), then wait until healthy:
``health`` (sh, exit 0) and ``health_url`` (polled from the node, 2xx), then the same
answer as before the write (``answer``: see ``ops/answer.py``). The agent bounds each to
its timeout; the client waits that long plus the link's time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from snapver.config import NodeSpec, url_problem
from snapver.errors import SnapverError, TransportError, UsageError
from snapver.ops.answer import Baseline, check_answer
from snapver.ops.nodeio import open_node
from snapver.ops.plan import NodePlan
from snapver.transport.base import Transport


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
    ``timeout`` seconds each; then ``answer``'s request, answered as before the write."""

    restart: str | None = None
    health: str | None = None
    health_url: str | None = None
    timeout: float = 300.0
    answer: Baseline | None = None

    def __bool__(self) -> bool:
        return bool(self.restart or self.health or self.health_url or self.answer)

    def to_json(self) -> dict[str, Any]:
        return {"restart": self.restart, "health": self.health, "health_url": self.health_url,
                "timeout": self.timeout,
                **({"health_request": self.answer.request.to_json()} if self.answer else {})}


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
    if hooks.answer is not None:
        # A server the restart left still starting is waited for (as health_url waits) up to the timeout.
        log.append(check_answer(transport, spec, hooks.answer, hooks.timeout if hooks.restart else 0.0))


def hooks_again(plan: NodePlan, hooks: Hooks, log: list[str]) -> SnapverError | None:
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


def hooks_for(specs: list[NodeSpec], restart: str | None = None, no_restart: bool = False,
              health: str | None = None, health_url: str | None = None,
              timeout: float | None = None) -> dict[str, Hooks]:
    """Each node's hooks: its config's ``restart``, ``health``, ``health_url`` and
    ``health_timeout``, each overridden by the command line's when given (``no_restart``:
    no restart whatever the config says). A bad ``health_url`` is a usage error."""
    if health_url is not None and url_problem(health_url):
        raise UsageError(f"--health-url: {url_problem(health_url)}")
    if restart is not None and not restart.strip():
        raise UsageError("--restart: expected a shell command, got an empty string", hint="--no-restart skips it")
    found = {}
    for spec in specs:
        found[spec.name] = Hooks(restart=None if no_restart else (restart or spec.restart),
                                 health=health or spec.health, health_url=health_url or spec.health_url,
                                 timeout=timeout if timeout is not None else spec.health_timeout)
    return found


def with_baselines(hooks: dict[str, Hooks], baselines: list[Baseline]) -> dict[str, Hooks]:
    """``hooks`` with each compared baseline (``ops/answer.ask_before``) added: its request is
    sent again after the restart and the health checks, and must be answered the same."""
    found = dict(hooks)
    for baseline in baselines:
        if baseline.answer is not None:
            found[baseline.node] = replace(found.get(baseline.node) or Hooks(), answer=baseline)
    return found
