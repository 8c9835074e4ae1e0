"""The same answer before and after: a node's health request (``snapver/healthrequest.py``)
is sent from the node before a push writes it, twice, and its answer kept; after the
restart and the health checks it is sent again, and a different answer fails the check.

Before the write, a request that cannot be compared is said once per node and skipped: a
server that is not up (refused, no answer, a 5xx), or one that answered differently the
two times (sampling with temperature > 0). A request that is wrong whatever the code
(a 4xx, a redirect, an answer larger than the cap, a reply without the ``match`` path)
refuses the push before anything is written.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from snapver.config import NodeSpec, url_problem
from snapver.errors import TransportError, UsageError
from snapver.healthrequest import (
    MAX_ANSWER,
    AnswerError,
    HealthRequest,
    check_options,
    select_answer,
    shorten,
    shorten_pair,
    with_options,
)
from snapver.model import quote_controls
from snapver.ops.plan import MAX_PARALLEL, NodePlan
from snapver.transport.base import Transport

NOT_DETERMINISTIC = "the answer is not deterministic: not compared"
_NOT_UP = ("down", "timeout")  # a server not serving yet: skipped before the write, waited for after


@dataclass(frozen=True)
class Baseline:
    """What ``node`` answered ``request`` before the write: ``answer`` (the compared part),
    or None and ``note``, why it is not compared."""

    node: str
    request: HealthRequest
    answer: str | None = None
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "request": self.request.to_json(), "compared": self.answer is not None,
                "answer": shorten(self.answer, width=200) if self.answer is not None else None,
                "note": self.note}


def check_request_options(url: str | None, body: str | None, match: str | None, timeout: float | None) -> None:
    """Refuse bad health request options (UsageError) before any node is asked."""
    check_options(url, body, match, timeout, url_problem)


def requests_for(specs: list[NodeSpec], url: str | None, body: str | None, match: str | None,
                 timeout: float | None) -> dict[str, HealthRequest]:
    """Each node's request: its config's ``health_request`` changed by the command line's
    options (see ``healthrequest.with_options``). Options that change a request no node has
    are a usage error."""
    found = {}
    for spec in specs:
        request = with_options(spec.health_request, url, body, match, timeout)
        if request is not None:
            found[spec.name] = request
    if not found and (body, match, timeout) != (None, None, None):
        raise UsageError("--health-body, --health-match and --health-request-timeout change a health request, "
                         "and none is set", hint="add --health-request URL (or health_request in the config)")
    return found


def ask(transport: Transport, spec: NodeSpec, request: HealthRequest, wait_up: float = 0.0) -> dict[str, Any]:
    """Send ``request`` from the node (the agent bounds each attempt to its timeout, and
    tries a server that is down again for ``wait_up`` seconds); the agent's reply."""
    deadline = wait_up + request.timeout + spec.connect_timeout + 10
    return transport.call_within(deadline, "health_request", url=request.url, method=request.method,
                                 body=request.body, timeout=request.timeout, wait_up=wait_up, cap=MAX_ANSWER)


def _answer(reply: dict[str, Any], request: HealthRequest) -> str:
    """The compared part of a reply; a reply without one raises AnswerError saying why."""
    if not reply.get("ok"):
        raise AnswerError(quote_controls(reply.get("said") or "no answer"))
    return select_answer(reply.get("body", ""), request.match)


def _baseline(plan: NodePlan, request: HealthRequest) -> Baseline:
    """Ask twice before the write: the answer kept, or why it is not compared."""
    assert plan.transport is not None  # planned over an open connection
    answers = []
    for _ in range(2):
        reply = ask(plan.transport, plan.spec, request)
        kind = reply.get("kind")
        if kind in _NOT_UP or (kind == "status" and (reply.get("status") or 0) >= 500):
            return Baseline(plan.node, request, note=f"{request.url} does not answer before the push "
                                                     f"({quote_controls(reply.get('said') or '')}): not compared")
        try:
            answers.append(_answer(reply, request))
        except AnswerError as exc:
            raise UsageError(f"{plan.node}: health request {request.url}: {exc}; nothing was written",
                             hint="check --health-request, --health-body and --health-match (or health_request "
                                  "in the config)") from None
    if answers[0] != answers[1]:
        return Baseline(plan.node, request, note=NOT_DETERMINISTIC)
    return Baseline(plan.node, request, answers[0])


def ask_before(plans: list[NodePlan], requests: dict[str, HealthRequest]) -> list[Baseline]:
    """The baselines of the plans' nodes that have a request, asked in parallel before any
    write; a request that is wrong whatever the code raises UsageError (nothing written)."""
    asked = [plan for plan in plans if plan.node in requests and plan.writes and plan.error is None]
    if not asked:
        return []
    with ThreadPoolExecutor(min(MAX_PARALLEL, len(asked))) as pool:
        return list(pool.map(lambda plan: _baseline(plan, requests[plan.node]), asked))


def check_answer(transport: Transport, spec: NodeSpec, baseline: Baseline, wait_up: float) -> str:
    """Send the request again (waiting up to ``wait_up`` seconds for a server still starting);
    an answer other than the baseline's, or none, raises TransportError quoting both."""
    request = baseline.request
    reply = ask(transport, spec, request, wait_up)
    try:
        after = _answer(reply, request)
    except AnswerError as exc:
        raise TransportError(f"{spec.name}: health request {request.url} failed: {exc}",
                             hint="the answer before the write was " + shorten(baseline.answer or "")) from None
    if after != baseline.answer:
        old, new = shorten_pair(baseline.answer or "", after)
        raise TransportError(f"{spec.name}: health request {request.url}: the answer changed: before {old}, "
                             f"after {new}", hint="the patch changes what the server answers")
    return f"{request.url}: same answer as before the write"
