"""A snapshot's environment (``.snapver/env``): what the snapshot engine records and what
``show``, ``diff --env`` and ``status`` read back.

The blob's id is in the snapshot's metadata (``env``) and, for the node's last snapshot, in
a side file: an unchanged re-pull learns whether the environment moved without reading git.
"""

from __future__ import annotations

import json
from typing import Any

from snapver.config import NodeSpec
from snapver.environment import ENV_PATH, Environment
from snapver.errors import StoreError
from snapver.store.cache import ENV_CACHE_VERSION, env_cache_path, of_version, write_atomic
from snapver.store.repo import Store
from snapver.transport.connect import open_transport

# The agent stops nvidia-smi after 3 s; the rest (distributions) is milliseconds.
ENV_DEADLINE = 30.0


def recorded_env_oid(store: Store, node: str, commit: str) -> str | None:
    """The id of the environment blob snapshot ``commit`` recorded (None: none recorded)."""
    try:
        cached = json.loads(env_cache_path(store, node).read_text())
        if isinstance(cached, dict) and of_version(cached, ENV_CACHE_VERSION) and cached.get("commit") == commit:
            oid = cached.get("env")
            return oid if isinstance(oid, str) else None
    except (OSError, ValueError):
        pass
    return env_oid_of(store.commit(commit).meta)


def remember_env_oid(store: Store, node: str, commit: str, oid: str) -> None:
    """Note that the node's last snapshot, ``commit``, recorded environment blob ``oid``."""
    write_atomic(env_cache_path(store, node), json.dumps({"v": ENV_CACHE_VERSION, "commit": commit,
                                                          "env": oid}).encode("ascii"))


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
