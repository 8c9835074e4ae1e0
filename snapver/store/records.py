"""The metadata a snapver commit carries: the JSON trailer of its message, and its fields.

Every commit snapver writes ends its message with one ``snapver-meta: {json}`` line
(``format_message``; read back by ``parse_meta``): that line is the on-disk format of a
snapshot's, a push record's, a patch's or a tag event's metadata, and survives ``git clone``.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

META_PREFIX = "snapver-meta: "
# The kinds of commit whose tree is exactly their manifest's files, checked by `fsck` and `sync`.
MANIFEST_KINDS = ("snapshot", "patch", "push")


def moment_ns(when: datetime) -> int:
    """A record's time to the microsecond, in nanoseconds (its meta's ``time_ns``)."""
    return round(when.timestamp() * 1_000_000) * 1000


def parse_meta(message: str) -> dict[str, Any]:
    for line in message.splitlines():
        if line.startswith(META_PREFIX):
            try:
                return json.loads(line[len(META_PREFIX):])
            except json.JSONDecodeError:
                return {}
    return {}


def format_message(subject: str, meta: dict[str, Any], body: str = "") -> str:
    text = subject.strip() + "\n\n"
    if body.strip():
        text += body.strip() + "\n\n"
    return text + META_PREFIX + json.dumps(meta, ensure_ascii=True, sort_keys=True, separators=(",", ":")) + "\n"
