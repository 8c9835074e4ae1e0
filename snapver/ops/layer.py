"""A container's writable layer: which container a snapshot or a push record saw, and what
that says later.

A file a push writes into a container lives in the container's writable layer: a
``docker rm`` + ``run`` (a pod restart) makes a new container from the image, and the
patch is gone. So each snapshot and push record of a container node keeps the container
and image ids its engine gives (``docker inspect`` on the host); ``status`` holds the
live container's id against the newest push record's, and a push says where its change
lives. Through an ``exec`` prefix (kubectl, nsenter) the runtime is not snapver's to ask:
such a node records that it was not asked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from snapver.config import NodeSpec
from snapver.errors import SnapverError
from snapver.transport.connect import open_transport

IDENTITY_TIMEOUT = 10.0  # seconds the engine's inspect may take on the host
SHORT = 12  # hex digits of an id in a sentence, as `docker ps` shows them


def identity_meta(spec: NodeSpec) -> dict[str, Any] | None:
    """What a record keeps of the node's container: ``{"engine", "name", "id", "image"}``
    (ids None when the engine did not answer), ``{"exec", "id": None, "image": None}`` for
    an exec prefix; None for a node not in a container."""
    if spec.exec_prefix:
        return {"exec": spec.exec_prefix[0], "id": None, "image": None}
    if not spec.container:
        return None
    try:
        # Asked of the engine on the host: no agent is started for it.
        found = open_transport(spec).container_identity(IDENTITY_TIMEOUT)
    except SnapverError:
        found = None
    container, image = found or (None, None)
    return {"engine": spec.engine, "name": spec.container, "id": container, "image": image}


def request_identity(spec: NodeSpec) -> Callable[[], dict[str, Any] | None]:
    """``identity_meta`` asked now in the background; the function returned waits for it
    (bounded: the engine's own deadline, then a grace)."""
    if not spec.in_container:
        return lambda: None
    found: list[dict[str, Any] | None] = [None]

    def ask() -> None:
        found[0] = identity_meta(spec)

    worker = threading.Thread(target=ask, daemon=True, name=f"snapver-identity-{spec.name}")
    worker.start()

    def wait() -> dict[str, Any] | None:
        worker.join(IDENTITY_TIMEOUT + 20)
        return found[0]

    return wait


def identities(specs: Iterable[NodeSpec]) -> dict[str, dict[str, Any] | None]:
    """``identity_meta`` of each node, asked in parallel, by node name."""
    waits = {spec.name: request_identity(spec) for spec in specs}
    return {name: wait() for name, wait in waits.items()}


def short_id(value: object) -> str:
    """``sha256:0123456789ab`` for an image id, ``0123456789ab`` for a container's."""
    text = str(value or "")
    algo, _, digest = text.rpartition(":")
    return f"{algo}:{digest[:SHORT]}" if algo else digest[:SHORT]


def recreated_note(live: dict[str, Any] | None, push: dict[str, Any] | None,
                   applied: Iterable[str]) -> str | None:
    """The status note of a node whose container is not the one its newest push wrote into;
    ``push``: that record (``PushState.to_json``), ``applied``: the patches its files hold."""
    if not live or not live.get("id") or not push or push.get("action") != "push":
        return None
    pushed_into = (push.get("container") or {}).get("id")
    if not pushed_into or pushed_into == live["id"]:
        return None
    name = push.get("patch") or "?"
    if name in set(applied):
        return f"container re-created since the push of {name} (the files still hold it)"
    return (f"container re-created from image {short_id(live.get('image'))} since the push of {name}: "
            "the patch is gone")


def layer_warning(patch: str, specs: Sequence[NodeSpec]) -> str | None:
    """What a push to containers says once: where its change lives, and how to keep it."""
    names = [spec.name for spec in specs if spec.in_container]
    if not names:
        return None
    return (f"the change to {', '.join(names)} lives in the container's writable layer: it is lost when the "
            "container is re-created (docker rm + run, a pod restart); to make it last, build it into the image: "
            f"`snapver patch export {patch}` is a diff to apply there (`patch -p1` in the folder holding sglang/)")
