"""tag: name a snapshot with a git tag in the store; list and delete tags."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from snapver.config import Config
from snapver.errors import RefError
from snapver.refs import resolve_snapshot
from snapver.store import refs
from snapver.store.repo import Commit, Store


@dataclass(frozen=True)
class TagInfo:
    """A tag and the snapshot (or patch) it names."""

    name: str
    commit: str
    node: str
    kind: str
    time: datetime
    replaced: str | None = None  # the commit it named before (tag --force)
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "commit": self.commit, "node": self.node, "kind": self.kind,
                "time": self.time.isoformat(), "replaced": self.replaced}


def _info(name: str, commit: Commit, replaced: str | None = None, note: str = "") -> TagInfo:
    meta = commit.meta
    return TagInfo(name, commit.id, str(meta.get("node") or ",".join(meta.get("nodes", [])) or "-"),
                   str(meta.get("kind", "snapshot")), commit.time.astimezone(), replaced, note)


def check_tag_name(name: str) -> None:
    """A tag name git accepts that the ref grammar can read back (``store.refs.check_name``)."""
    refs.check_name("tag", name)


def create_tag(store: Store, config: Config, name: str, ref: str | None = None, force: bool = False) -> TagInfo:
    """Point tag ``name`` at the snapshot ``ref`` names (default: the newest snapshot of all)."""
    check_tag_name(name)
    with store.lock():
        commit_id = resolve_snapshot(store, config, ref) if ref else _newest_snapshot(store)
        existing = store.ref(refs.tag_ref(name))
        if existing and not force:
            if existing == commit_id:
                return _info(name, store.commit(commit_id), note="already there")
            raise RefError(f"tag {name!r} already names {existing[:10]}",
                           hint=f"delete it with `snapver tag -d {name}`, or use --force to move it")
        store.update_ref(refs.tag_ref(name), commit_id)
        note = ""
        if name in config.nodes or name in store.refs(refs.NODES):
            note = f"{name!r} is also a node: say tags/{name} for the tag, {name}@latest for the node"
        return _info(name, store.commit(commit_id), existing if existing != commit_id else None, note)


def _newest_snapshot(store: Store) -> str:
    heads = store.refs(refs.NODES)
    if not heads:
        raise RefError("there is no snapshot to tag yet", hint="run `snapver pull` first")
    newest = store.commits([refs.node_ref(node) for node in sorted(heads)], limit=1)
    return newest[0].id


def delete_tag(store: Store, name: str) -> TagInfo:
    """Remove tag ``name``; returns what it named."""
    with store.lock():
        commit_id = store.ref(refs.tag_ref(name)) if refs.valid_ref_name(name) else None
        if commit_id is None:
            known = sorted(store.refs(refs.TAGS))
            raise RefError(f"no tag {name!r}", hint=f"tags: {', '.join(known) or '(none)'}")
        info = _info(name, store.commit(commit_id))
        store.delete_ref(refs.tag_ref(name))
        return info


def list_tags(store: Store) -> list[TagInfo]:
    """Every tag with the snapshot it names, by name."""
    tags = store.refs(refs.TAGS)
    if not tags:
        return []
    commits = {c.id: c for c in store.commits(sorted(set(tags.values())), no_walk=True)}
    return [_info(name, commits[commit]) for name, commit in sorted(tags.items())]
