"""The ref grammar (SPEC "Refs"): text → the snapshot, patch or live node it names."""

from __future__ import annotations

import re

from snapver.config import Config
from snapver.errors import RefError
from snapver.store import refs as store_refs
from snapver.store.repo import Store

_HEX = re.compile(r"^[0-9a-f]{7,40}$")
_TILDE = re.compile(r"^(?P<node>[^@~]+)~(?P<n>\d+)$")


def resolve_snapshot(store: Store, config: Config, text: str) -> str:
    """The commit id a ref names, where only a snapshot (or patch) fits."""
    if text.startswith("-"):
        raise RefError(f"unknown ref {text!r}: refs cannot start with '-'")
    tag = store.ref(store_refs.tag_ref(text)) if store_refs.valid_ref_name(text) else None
    node_names = set(config.nodes) | set(store.refs(store_refs.NODES))
    if tag and text in node_names:
        raise RefError(f"ambiguous ref {text!r}: a tag and a node share the name",
                       hint=f"say {text}@latest for the node's newest snapshot")
    if tag:
        return tag
    match = _TILDE.match(text)
    node, back = (match["node"], int(match["n"])) if match else (text.removesuffix("@latest"), 0)
    if node in node_names:
        head = store.ref(store_refs.node_ref(node))
        if head is None:
            raise RefError(f"node {node!r} has no snapshot yet", hint=f"run `snapver pull {node}`")
        history = store.commits([head], limit=back + 1)
        if len(history) <= back:
            raise RefError(f"{text!r}: node {node!r} has only {len(history)} snapshots")
        return history[back].id
    if _HEX.match(text):
        found = store.git("rev-parse", "--disambiguate=" + text).decode().split() if len(text) < 40 else [text]
        commits = [oid for oid in found if store.git("cat-file", "-t", oid).strip() == b"commit"]
        if len(commits) == 1:
            return commits[0]
        if len(commits) > 1:
            raise RefError(f"ambiguous ref {text!r}", hint="could be: " + ", ".join(c[:12] for c in commits))
    patch = store.ref(store_refs.patch_ref(text)) if store_refs.valid_ref_name(text) else None
    if patch:
        return patch
    known = sorted(node_names) + sorted(store.refs(store_refs.TAGS))
    raise RefError(f"unknown ref {text!r}", hint=f"known nodes and tags: {', '.join(known) or '(none)'}")
