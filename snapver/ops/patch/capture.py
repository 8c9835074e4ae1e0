"""Capturing a node's live drift from a base snapshot as a patch."""

from __future__ import annotations

from collections.abc import Iterable

from snapver.config import Config
from snapver.model import Entry
from snapver.ops.live import list_live
from snapver.ops.patch.model import (
    Patch,
    build_tree,
    check_new_name,
    check_targets,
    entry_for,
    load_patch,
    patch_meta,
    resolve_base,
    same_entry,
    within_tracked,
    write_patch_commit,
)
from snapver.store.repo import Store


def capture_patch(store: Store, config: Config, name: str, node: str, base_ref: str,
                  nodes: Iterable[str] = (), message: str = "") -> Patch | None:
    """Turn a node's live drift from the base into a patch; None when there is none."""
    from snapver.transport.connect import open_transport

    check_new_name(store, config, name)
    spec = config.node(node)
    targets = check_targets(config, nodes) or (spec.name,)
    base = resolve_base(store, config, base_ref)
    with open_transport(spec) as transport:
        listing = list_live(store, transport)
        live = listing.by_path()
        changed = [e for e in listing.entries if not same_entry(base.manifest.get(e.path), e.kind, e.oid, e.mode)]
        changes: dict[str, tuple[Entry | None, bytes | None]] = {
            e.path: (None, None) for e in base.manifest if e.path not in live and within_tracked(e.path, spec.paths)}
        by_path = {e.path: e for e in changed}
        for path, kind, data in transport.read_files(list(by_path)):
            if kind is None:
                if path in base.manifest:
                    changes[path] = (None, None)
                continue
            entry = entry_for(path, kind, by_path[path].mode, data)
            if not same_entry(base.manifest.get(path), entry.kind, entry.oid, entry.mode):
                changes[path] = (entry, data)
    if not changes:
        return None
    manifest, blobs = build_tree(base.manifest, changes)
    meta = patch_meta(base, targets, message or f"captured from {spec.name}", "capture", len(changes))
    meta["captured_from"] = spec.name
    write_patch_commit(store, name, base.commit, manifest, blobs, meta, None)
    return load_patch(store, name)
