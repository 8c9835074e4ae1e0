"""A health request: one HTTP request sent from a node before a push writes it and again
after the restart; a different answer fails the health check.

Pure values and text, no I/O: the request as the config (``health_request = { url = …,
method = …, body = …, match = …, timeout = … }``) and the command line give it, the part
of a reply that is compared (``match``: a dotted JSON path such as ``choices.0.text``;
absent, the whole body), and the two answers shortened for a message.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from snapver.errors import UsageError
from snapver.model import quote_path

MAX_ANSWER = 1 << 20  # a reply longer than this is a failure, never held whole
DEFAULT_REQUEST_TIMEOUT = 60.0
METHODS = ("GET", "POST")
TABLE_KEYS = ("url", "method", "body", "match", "timeout")
SHOWN = 60  # characters of each answer a message shows


class AnswerError(ValueError):
    """A reply whose compared part cannot be taken (not JSON, no such path)."""


@dataclass(frozen=True)
class HealthRequest:
    """One request: ``method`` to ``url`` with ``body`` (JSON text, sent as
    application/json); ``match`` selects what is compared; each attempt takes at most
    ``timeout`` seconds."""

    url: str
    method: str = "GET"
    body: str | None = None
    match: str | None = None
    timeout: float = DEFAULT_REQUEST_TIMEOUT

    def to_json(self) -> dict[str, Any]:
        return {"url": self.url, "method": self.method, "body": self.body, "match": self.match,
                "timeout": self.timeout}


def match_problem(match: str) -> str:
    """Why ``match`` is not a dotted path ("" when it is): names and list indexes, no empty step."""
    if not match or any(not step.strip() or step != step.strip() for step in match.split(".")):
        return f"expected a dotted path such as text or choices.0.text, got {match!r}"
    return ""


def body_problem(body: str) -> str:
    """Why ``body`` is not a JSON document ("" when it is)."""
    try:
        json.loads(body)
    except ValueError as exc:
        return f"expected a JSON document, got {body[:40]!r}: {exc}"
    return ""


def timeout_problem(timeout: object) -> str:
    """Why ``timeout`` is not a number of seconds ("" when it is)."""
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < math.inf:
        return f"expected a positive number of seconds, got {timeout!r}"
    return ""


def from_table(table: object, url_problem: Callable[[str], str],
               fail: Callable[[str, str], Exception], key: str) -> HealthRequest:
    """The request a config table describes; a wrong key, type or value raises ``fail(key…)``."""
    if not isinstance(table, dict):
        raise fail(key, 'expected a table such as { url = "http://127.0.0.1:30000/generate", body = \'{…}\', '
                        'match = "text" }')
    for name in table:
        if name not in TABLE_KEYS:
            raise fail(f"{key}.{name}", f"unknown key (allowed: {', '.join(TABLE_KEYS)})")
    for name in ("url", "method", "body", "match"):
        if name in table and not isinstance(table[name], str):
            raise fail(f"{key}.{name}", f"expected a string, got {type(table[name]).__name__} {table[name]!r}")
    if "url" not in table:
        raise fail(f"{key}.url", "missing: the URL to ask, e.g. http://127.0.0.1:30000/generate")
    problems = {"url": url_problem(table["url"]),
                "body": body_problem(table["body"]) if "body" in table else "",
                "match": match_problem(table["match"]) if "match" in table else "",
                "timeout": timeout_problem(table["timeout"]) if "timeout" in table else ""}
    method = table.get("method", "POST" if "body" in table else "GET").upper()
    if method not in METHODS:
        problems["method"] = f"expected GET or POST, got {table['method']!r}"
    elif method == "GET" and "body" in table:
        problems["method"] = "GET sends no body: use POST, or leave the body out"
    for name, problem in problems.items():
        if problem:
            raise fail(f"{key}.{name}", problem)
    return HealthRequest(table["url"], method, table.get("body"), table.get("match"),
                         float(table.get("timeout", DEFAULT_REQUEST_TIMEOUT)))


def check_options(url: str | None, body: str | None, match: str | None, timeout: float | None,
                  url_problem: Callable[[str], str]) -> None:
    """Refuse bad ``--health-request``, ``--health-body``, ``--health-match`` and
    ``--health-request-timeout`` values (UsageError), before any node is asked."""
    problems = [("--health-request", url_problem(url) if url is not None else ""),
                ("--health-body", body_problem(body) if body is not None else ""),
                ("--health-match", match_problem(match) if match is not None else ""),
                ("--health-request-timeout", timeout_problem(timeout) if timeout is not None else "")]
    for option, problem in problems:
        if problem:
            raise UsageError(f"{option}: {problem}",
                             hint="e.g. --health-request http://127.0.0.1:30000/generate --health-body "
                                  "'{\"text\": \"2+2=\", \"sampling_params\": {\"temperature\": 0}}' "
                                  "--health-match text")


def with_options(configured: HealthRequest | None, url: str | None, body: str | None, match: str | None,
                 timeout: float | None) -> HealthRequest | None:
    """A node's request: the command line's URL makes a new one (POST when a body is given,
    else GET); without it the other options change the configured one."""
    if url is not None:
        return HealthRequest(url, "POST" if body is not None else "GET", body, match,
                             timeout if timeout is not None else DEFAULT_REQUEST_TIMEOUT)
    if configured is None:
        return None
    return HealthRequest(configured.url, "POST" if body is not None else configured.method,
                         body if body is not None else configured.body,
                         match if match is not None else configured.match,
                         timeout if timeout is not None else configured.timeout)


def select_answer(body: str, match: str | None) -> str:
    """The compared part of a reply: the whole body, or the value at the dotted path
    ``match`` of its JSON (a string as it is, anything else as canonical JSON)."""
    if match is None:
        return body
    try:
        value: Any = json.loads(body.encode("utf-8", "surrogateescape"))
    except ValueError:
        raise AnswerError(f"the reply is not JSON, so it has no {match}: {shorten(body)}") from None
    walked: list[str] = []
    for step in match.split("."):
        walked.append(step)
        if isinstance(value, dict) and step in value:
            value = value[step]
        elif isinstance(value, list) and step.isdigit() and int(step) < len(value):
            value = value[int(step)]
        else:
            raise AnswerError(f"the reply has no {'.'.join(walked)}: {shorten(body)}")
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)


def shorten(text: str, start: int = 0, width: int = SHOWN) -> str:
    """``text[start:start + width]`` quoted for one line of a message (C-style escapes for
    control characters and bytes that are not UTF-8), marked where it was cut."""
    piece = text[start:start + width]
    quoted = quote_path(piece)
    if not quoted.startswith('"'):
        quoted = f'"{quoted}"'
    return ("…" if start else "") + quoted + ("…" if start + width < len(text) else "") + \
        (f" ({len(text)} characters)" if len(text) > width else "")


def shorten_pair(before: str, after: str, width: int = SHOWN) -> tuple[str, str]:
    """Both answers shortened around where they first differ (a shared beginning is cut)."""
    common = 0
    for old, new in zip(before, after, strict=False):
        if old != new:
            break
        common += 1
    start = max(0, common - width // 3) if common > width // 2 else 0
    return shorten(before, start, width), shorten(after, start, width)
