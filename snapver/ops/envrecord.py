"""A snapshot's environment (``.snapver/env``): what the snapshot engine records and what
``show``, ``diff --env`` and ``status`` read back.

The blob's id is in the snapshot's metadata (``env``) and, for the node's last snapshot, in
a side file: an unchanged re-pull learns whether the environment moved without reading git.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from snapver.config import NodeSpec
from snapver.environment import DRIVER, ENV_PATH, GPU, KERNEL, Environment
from snapver.errors import StoreError, TransportError
from snapver.model import quote_controls
from snapver.store.cache import ENV_CACHE_VERSION, env_cache_path, of_version, write_atomic
from snapver.store.repo import Store
from snapver.transport.base import Transport
from snapver.transport.connect import open_transport

# The agent stops nvidia-smi after 3 s; the rest (distributions) is milliseconds.
ENV_DEADLINE = 30.0


def _side_file(store: Store, node: str, commit: str | None) -> dict[str, Any] | None:
    """The node's environment side file, when it is of this version and about ``commit``."""
    try:
        cached = json.loads(env_cache_path(store, node).read_text())
    except (OSError, ValueError):
        return None
    if isinstance(cached, dict) and of_version(cached, ENV_CACHE_VERSION) and cached.get("commit") == commit:
        return cached
    return None


def recorded_env_oid(store: Store, node: str, commit: str) -> str | None:
    """The id of the environment blob snapshot ``commit`` recorded (None: none recorded)."""
    cached = _side_file(store, node, commit)
    if cached is not None:
        oid = cached.get("env")
        return oid if isinstance(oid, str) else None
    return env_oid_of(store.commit(commit).meta)


def remember_env_oid(store: Store, node: str, commit: str, oid: str, mark: str = "") -> None:
    """Note that the node's last snapshot, ``commit``, recorded environment blob ``oid``, read
    from what the agent's ``mark`` sums up."""
    write_atomic(env_cache_path(store, node), json.dumps({"v": ENV_CACHE_VERSION, "commit": commit,
                                                          "env": oid, "mark": mark}).encode("ascii"))


def remembered_env(store: Store, node: str, commit: str | None) -> tuple[str, str] | None:
    """``(blob id, mark)`` of the environment snapshot ``commit`` recorded, when the side file
    is about that snapshot and has a mark; else None (the environment is read whole)."""
    cached = _side_file(store, node, commit)
    if cached is None:
        return None
    oid, mark = cached.get("env"), cached.get("mark")
    return (oid, mark) if isinstance(oid, str) and isinstance(mark, str) and mark else None


def env_oid_of(meta: dict[str, Any]) -> str | None:
    oid = meta.get("env")
    return oid if isinstance(oid, str) else None


def snapshot_environment(store: Store, commit: str, meta: dict[str, Any] | None = None) -> Environment | None:
    """The environment a snapshot recorded; None when it recorded none (or one that cannot be read)."""
    if meta is not None and env_oid_of(meta) is None:
        return None
    try:
        return Environment.from_blob(store.read_blob(f"{commit}:{ENV_PATH}"))
    except (StoreError, ValueError):
        return None


def live_environment(spec: NodeSpec) -> Environment:
    """A node's environment, read now on a connection of its own."""
    with open_transport(spec) as transport:
        return transport.request_environment(within=ENV_DEADLINE)()


def environment_or_none(asked: Callable[[], Environment] | None, transport: Transport) -> Environment | None:
    """A node's environment asked beside another request, if asked for and answered: an agent
    still in step after refusing it is no failure of the command it serves."""
    if asked is None:
        return None
    try:
        return asked()
    except TransportError:
        if transport.is_open:
            return None
        raise


NOTED_ITEMS = 3  # items said per node; the rest counted
NOT_COMPARED_IN_GROUPS = (GPU, DRIVER, KERNEL)  # not read cheaply (GPU), or differing harmlessly (kernel)


def group_outlier_notes(environments: Mapping[str, Environment],
                        groups: Mapping[str, Sequence[str]]) -> dict[str, list[str]]:
    """For each node, its items whose value differs from what most of its peers have: the
    other nodes read of its first group with two or more of them read, else every other
    node read. ``torch differs from 7 of 8 nodes in tp8 (2.9.0+cu128; the others 2.9.1+cu128)``."""
    items = {node: env.items() for node, env in environments.items()}
    notes: dict[str, list[str]] = {}
    for node in items:
        group, peers = _peers(node, list(items), groups)
        if len(peers) < 2:
            continue
        found = []
        for item in sorted({name for peer in [node, *peers] for name in items[peer]} - set(NOT_COMPARED_IN_GROUPS)):
            mine = items[node].get(item)
            theirs = Counter(items[peer].get(item) for peer in peers)
            most, count = theirs.most_common(1)[0]
            if most != mine and count * 2 > len(peers):
                differ = sum(n for value, n in theirs.items() if value != mine)
                where = f" in {group}" if group else ""
                found.append(f"{quote_controls(item)} differs from {differ} of {len(peers)} nodes{where} "
                             f"({_shown(mine)}; the others {_shown(most)})")
        if found:
            more = len(found) - NOTED_ITEMS
            notes[node] = found[:NOTED_ITEMS] + ([f"and {more} more items differ from its group "
                                                  f"(snapver env {group or ''})".replace(" )", ")")]
                                                 if more > 0 else [])
    return notes


def _peers(node: str, read: list[str], groups: Mapping[str, Sequence[str]]) -> tuple[str, list[str]]:
    for name, members in groups.items():
        peers = [member for member in members if member != node and member in read]
        if node in members and len(peers) >= 2:
            return name, peers
    return "", [other for other in read if other != node]


def _shown(value: str | None) -> str:
    return "not installed" if value is None else quote_controls(value)
