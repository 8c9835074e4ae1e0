"""tag: name a snapshot with a git tag in the store; list and delete tags."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from snapver.config import Config
from snapver.errors import RefError, StoreError
from snapver.model import Manifest
from snapver.refs import resolve_snapshot
from snapver.store import refs
from snapver.store.records import format_message
from snapver.store.repo import Commit, Store
from snapver.store.team import TeamView, tag_conflict_error


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
                "time": self.time.isoformat(), "replaced": self.replaced, "note": self.note}


def _info(name: str, commit: Commit, replaced: str | None = None, note: str = "") -> TagInfo:
    meta = commit.meta
    return TagInfo(name, commit.id, str(meta.get("node") or ",".join(meta.get("nodes", [])) or "-"),
                   str(meta.get("kind", "snapshot")), commit.time.astimezone(), replaced, note)


def check_tag_name(name: str) -> None:
    """A tag name git accepts that the ref grammar can read back (``store.refs.check_name``)."""
    refs.check_name("tag", name)


def check_not_a_patch(view: TeamView, name: str) -> None:
    """A tag is not named like a patch: `show NAME` could no longer say which is meant."""
    if name in view.merged(refs.PATCHES):
        raise RefError(f"a tag cannot be named like the patch {name!r}",
                       hint="pick another name (a ref naming both would be ambiguous)")


def create_tag(store: Store, config: Config, name: str, ref: str | None = None, force: bool = False) -> TagInfo:
    """Point tag ``name`` at the snapshot ``ref`` names (default: the newest snapshot of all).

    Tags are team-wide: one that another writer holds at another snapshot is moved only
    with ``force``, and the move is recorded (a tag event) so that every store, once
    synced, reads the tag as this one.
    """
    check_tag_name(name)
    with store.lock():
        commit_id = resolve_snapshot(store, config, ref) if ref else _newest_snapshot(store)
        view = TeamView(store)
        check_not_a_patch(view, name)
        values, conflicts = view.tags()
        if name in conflicts and not force:
            raise tag_conflict_error(name, conflicts[name])
        existing = values.get(name)
        if existing and not force:
            if existing == commit_id:
                return _info(name, store.commit(commit_id), note="already there")
            raise RefError(f"tag {name!r} already names {existing[:10]}",
                           hint=f"delete it with `snapver tag -d {name}`, or use --force to move it")
        store.update_ref(refs.tag_ref(name), commit_id)
        _record_event(store, view, name, commit_id)
        note = ""
        if name in config.nodes or name in view.merged(refs.NODES):
            note = f"{name!r} is also a node: say tags/{name} for the tag, {name}@latest for the node"
        replaced = existing or (",".join(sorted(set(conflicts[name].values()))) if name in conflicts else None)
        return _info(name, store.commit(commit_id), replaced if replaced != commit_id else None, note)


def _record_event(store: Store, view: TeamView, name: str, to: str | None) -> None:
    """Record a tag event when other writers hold ``name`` (or events name it already): the
    values it overrules, so that every synced store reads the tag as ``to`` (None: deleted)."""
    if not view.is_team:
        return
    others = {commit for writer, commit in view.tag_writers(name).items() if writer != view.me}
    named_before = any(event.tag == name for event in view.tag_events())
    if not others and not named_before:
        return
    over = sorted((others | set(view.tag_writers(name).values())) - {to})
    now = datetime.now(timezone.utc)
    meta = {"v": 1, "kind": "tag-move", "tag": name, "to": to, "over": over, "writer": view.me,
            "time": now.isoformat(timespec="seconds")}
    subject = f"tag {name}: " + (f"moved to {to[:10]}" if to else "deleted") + f" by {view.me}"
    # Every writer's events seen here become parents: events are read parents first (git's
    # date order keeps children after parents), so this one comes after all it overrules,
    # even when their clocks agree to the second.
    mine = store.ref(refs.TAG_MOVES)
    seen = tuple(sorted({commit for writer, commit in view.event_tips().items() if writer != view.me} - {mine}))
    with store.importer() as importer:
        importer.commit(refs.TAG_MOVES, mine, Manifest(), format_message(subject, meta), now, also_parents=seen)


def _newest_snapshot(store: Store) -> str:
    heads = TeamView(store).merged(refs.NODES)
    if not heads:
        raise RefError("there is no snapshot to tag yet", hint="run `snapver pull` first")
    newest = store.commits(sorted(set(heads.values())), limit=1)
    return newest[0].id


def delete_tag(store: Store, name: str) -> TagInfo:
    """Remove tag ``name`` (for the team: other writers' values of it are overruled); returns what it named."""
    with store.lock():
        view = TeamView(store)
        values, conflicts = view.tags()
        commit_id = values.get(name) if refs.valid_ref_name(name) else None
        if commit_id is None and name in conflicts:
            commit_id = view.newest(conflicts[name])
        if commit_id is None:
            known = sorted(values)
            raise RefError(f"no tag {name!r}", hint=f"tags: {', '.join(known) or '(none)'}")
        info = _info(name, store.commit(commit_id))
        if store.ref(refs.tag_ref(name)):
            store.delete_ref(refs.tag_ref(name))
        _record_event(store, view, name, None)
        return info


def list_tags(store: Store) -> list[TagInfo]:
    """Every tag with the snapshot it names, by name; a tag whose writers disagree is listed
    once per value, noted ``conflict``."""
    view = TeamView(store)
    tags, conflicts = view.tags()
    rows = [(name, commit, "") for name, commit in tags.items()]
    rows += [(name, commit, f"conflict: {writer}") for name, by in conflicts.items() for writer, commit in by.items()]
    if not rows:
        return []
    commits = {c.id: c for c in store.commits(sorted({commit for _, commit, _ in rows}), no_walk=True)}
    for name, commit, _ in rows:
        if commit not in commits:  # a tag ref pointing at a blob or a tree
            raise StoreError(f"tag {name!r} names {commit[:10]}, which is not a commit: the store is damaged",
                             hint="run `snapver fsck`")
    return [_info(name, commits[commit], note=note) for name, commit, note in sorted(rows)]
