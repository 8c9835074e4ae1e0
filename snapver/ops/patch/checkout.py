"""The editable checkout of a patch (`patch new`, `patch save`): a folder beside the store."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from snapver.config import DEFAULT_EXCLUDE, Config
from snapver.errors import ConflictError, StoreError, UsageError
from snapver.model import FILE, LINK, MAX_NAME_LENGTH, Entry, Manifest, is_safe_relpath
from snapver.ops.patch.model import (
    Base,
    Patch,
    PatchFile,
    changed_files,
    check_new_name,
    check_targets,
    entry_for,
    load_patch,
    patch_meta,
    patch_tip,
    resolve_base,
    same_entry,
    with_warnings,
    within_tracked,
    write_patch_commit,
)
from snapver.store import refs
from snapver.store.objects import blob_oid
from snapver.store.pack import current_umask
from snapver.store.repo import BIG_BLOB, Store
from snapver.transport.agent.listing import exclusion

CHECKOUTS = ".snapver-patches"
MARKER = ".snapver-checkout"


def checkout_folder(store: Store, name: str) -> Path:
    """Where a patch's editable checkout lives: beside the store, one folder per patch."""
    if len(name) > MAX_NAME_LENGTH:
        refs.check_name("patch", name)  # no patch has such a name: say so before the file system does
    return store.path.parent / CHECKOUTS / name


@dataclass
class Checkout:
    patch: Patch
    folder: Path
    files: int


def _read_marker(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / MARKER).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{folder} is not a patch checkout ({MARKER} is missing or unreadable)",
                         hint="make one with `snapver patch new NAME --base REF`") from exc


def write_checkout(store: Store, folder: Path, manifest: Manifest, marker: dict[str, Any],
                    overrides: dict[str, bytes] | None = None) -> int:
    """Write a tree into a fresh folder (links as links) plus its marker.

    File modes are the recorded ones less the user's umask and any setuid/setgid/sticky
    bit (a checkout is the user's working copy); ``scan_checkout`` reads them back.
    Nothing is ever written through a symlink, whatever the manifest says.
    """
    overrides = overrides or {}
    folder.mkdir(parents=True, exist_ok=True)
    root = os.path.realpath(os.fsencode(folder))
    umask = current_umask()
    marker = {**marker, "umask": umask}
    by_oid: dict[str, list[Entry]] = {}
    for entry in manifest:
        if entry.path not in overrides:
            by_oid.setdefault(entry.oid, []).append(entry)

    def put(entry: Entry, data: bytes | Iterable[bytes]) -> None:
        target = os.path.join(os.fsencode(folder), os.fsencode(entry.path))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not is_safe_relpath(entry.path) or not os.path.realpath(os.path.dirname(target)).startswith(root + b"/"):
            raise StoreError(f"{entry.path!r} would be written outside {folder} (through a symlink); refused",
                             hint="run `snapver fsck`")
        if entry.kind == LINK:
            os.symlink(data if isinstance(data, bytes) else b"".join(data), target)
        else:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "wb") as handle:
                for piece in [data] if isinstance(data, bytes) else data:
                    handle.write(piece)
            os.chmod(target, stat.S_IMODE(entry.mode) & 0o777 & ~umask)

    # A big file is copied from the store in pieces, never held whole.
    big = {oid for oid, entries in by_oid.items() if all(e.kind == FILE and e.size > BIG_BLOB for e in entries)}
    for oid, data in store.read_blobs(oid for oid in by_oid if oid not in big):
        for entry in by_oid[oid]:
            put(entry, data)
    for oid in sorted(big):
        for entry in by_oid[oid]:
            put(entry, store.blob_chunks(oid))
    for path, data in overrides.items():
        put(manifest.entries[path], data)
    (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return len(manifest)


def new_patch(store: Store, config: Config, name: str, base_ref: str | None,
              nodes: Iterable[str] = (), message: str = "", from_folder: str | None = None,
              root: str | None = None) -> Checkout:
    """Start a patch: record it (no change yet) and check its base out for editing.

    For an existing patch without ``base_ref``, check out its current tree instead.
    ``from_folder``: a folder (matched as a folder ref is, ``root`` as ``--root``) whose
    tree the patch makes of the base: every file that differs, is new or is missing there.
    """
    # The name first: a folder named after a name no store would keep cannot be looked at.
    if base_ref is None:
        patch = load_patch(store, name, with_files=False)
    else:
        check_new_name(store, config, name)
    folder = checkout_folder(store, name)
    if folder.exists() and any(folder.iterdir()):
        raise UsageError(f"{folder} already exists", hint=f"edit it and `snapver patch save {name}`, "
                         "or remove the folder to check the patch out again")
    if from_folder is not None and base_ref is None:
        raise UsageError("--from needs --base: the snapshot the folder's changes apply to")
    if base_ref is None:
        manifest = store.manifest(patch.commit)
    else:
        targets = check_targets(config, nodes)
        base = resolve_base(store, config, base_ref)
        manifest, source = base.manifest, "new"
        blobs: list[bytes] = []
        if from_folder is not None:
            manifest, blobs = _folder_tree(store, config, base, from_folder, root)
            source = "folder"
        meta = patch_meta(base, targets, message, source, len(changed_files(base.manifest, manifest)))
        if from_folder is not None:
            meta["from"] = from_folder
        write_patch_commit(store, name, base.commit, manifest, blobs, meta, None)
        patch = load_patch(store, name, with_files=False)
    marker = {"name": name, "store": str(store.path), "head": patch.commit, "parent": patch.commit,
              "base": patch.base, "paths": list(patch.paths)}
    files = write_checkout(store, folder, manifest, marker)
    return Checkout(load_patch(store, name), folder, files)


def _folder_tree(store: Store, config: Config, base: Base, text: str,
                 root: str | None) -> tuple[Manifest, list[bytes]]:
    """The base's tracked paths as a folder holds them (read by the local agent, links as
    links), and the content of the files that differ from the base."""
    from snapver.folders import resolve_folder
    from snapver.transport.local import FolderTransport

    tree = resolve_folder(text, config, store, root, base.paths)
    entries: dict[str, Entry] = {}
    blobs: list[bytes] = []
    with FolderTransport(tree.spec(), tree.roots) as transport:
        listing = transport.list_tree()
        changed = {e.path: e for e in listing.entries
                   if not same_entry(base.manifest.get(e.path), e.kind, e.oid, e.mode)}
        for entry in listing.entries:
            if entry.path not in changed:
                entries[entry.path] = base.manifest.entries[entry.path]
        for path, kind, data in transport.read_files(list(changed)):
            if kind is None:
                raise UsageError(f"{path} vanished from {text} while it was read; run the command again")
            entries[path] = entry_for(path, kind, changed[path].mode, data)
            blobs.append(data)
    # Base files outside the tracked paths the folder stands for are kept as they are.
    for path, kept in base.manifest.entries.items():
        if not within_tracked(path, tree.tracked):
            entries.setdefault(path, kept)
    return Manifest(entries), blobs


def recorded_mode(st_mode: int, known: Entry | None, umask: int) -> int:
    """The mode to record for a checkout file: the bits the checkout's umask (and
    ``write_checkout``) took away are the known entry's, the rest are the file's."""
    if known is None or known.kind != FILE or not umask:
        return st_mode
    hidden = umask | 0o7000
    return stat.S_IFMT(st_mode) | (stat.S_IMODE(st_mode) & ~hidden) | (stat.S_IMODE(known.mode) & hidden)


def scan_checkout(folder: Path, paths: Iterable[str], known: Manifest,
                  exclude: Iterable[str] = DEFAULT_EXCLUDE, umask: int = 0) -> tuple[Manifest, dict[str, bytes]]:
    """The tree in a checkout folder (links as links, excluded names skipped); content is
    returned only for blobs ``known`` does not hold. ``umask``: the one it was made with."""
    excluded = exclusion(list(exclude))  # the node's own rules
    entries: dict[str, Entry] = {}
    new_content: dict[str, bytes] = {}
    known_by_path = known.entries
    root = os.fsencode(folder)
    for tracked in paths:
        stack = [os.fsencode(tracked.strip("/"))]
        while stack:
            rel = stack.pop()
            try:
                scan = os.scandir(os.path.join(root, rel))
            except FileNotFoundError:
                continue
            with scan as items:
                for item in items:
                    child = os.path.join(rel, item.name)
                    path = os.fsdecode(child)
                    st = item.stat(follow_symlinks=False)
                    if excluded(os.fsdecode(item.name), path, stat.S_ISDIR(st.st_mode)):
                        continue
                    if stat.S_ISDIR(st.st_mode):
                        stack.append(child)
                        continue
                    if stat.S_ISLNK(st.st_mode):
                        kind, data = LINK, os.readlink(os.path.join(root, child))
                    elif stat.S_ISREG(st.st_mode):
                        kind = FILE
                        with open(os.path.join(root, child), "rb") as handle:
                            data = handle.read()
                    else:
                        continue
                    oid = blob_oid(data)
                    old = known_by_path.get(path)
                    mode = recorded_mode(st.st_mode, old, umask)
                    if old is not None and old.oid == oid and old.kind == kind:
                        entries[path] = Entry(path, kind, mode, old.size, old.digest, oid)
                    else:
                        entries[path] = entry_for(path, kind, mode, data)
                        new_content[path] = data
    return Manifest(entries), new_content


@dataclass
class SaveResult:
    patch: Patch
    saved: bool
    changed: list[PatchFile]  # against the previous patch commit


def save_patch(store: Store, config: Config, name: str, message: str = "") -> SaveResult:
    """Record the checkout's edits as a new commit of the patch (nothing to save: none)."""
    folder = checkout_folder(store, name)
    if not folder.is_dir():
        load_patch(store, name, with_files=False)
        raise UsageError(f"patch {name!r} has no checkout at {folder}",
                         hint=f"make one with `snapver patch new {name}`")
    marker = _read_marker(folder)
    tip = patch_tip(store, name)
    if tip != marker.get("head"):
        raise ConflictError(f"patch {name!r} moved since {folder} was checked out "
                            f"({str(marker.get('head'))[:10]} → {str(tip)[:10]})",
                            hint="move the folder aside and check the patch out again with "
                            f"`snapver patch new {name}`")
    previous = load_patch(store, name, with_files=False)
    parent = marker["parent"]  # the patch's tip, or the new base of a rebase being finished
    base_id = marker["base"]
    base_meta = store.commit(base_id).meta
    known = store.manifest(parent)
    scanned, new_content = scan_checkout(folder, marker.get("paths") or previous.paths, known,
                                         _excludes(config, previous), marker.get("umask", 0))
    changed = changed_files(known, scanned)
    rebasing = parent != tip
    if not changed and not rebasing and not message:
        return SaveResult(previous, False, [])
    base_manifest = store.manifest(base_id)
    files = len(changed_files(base_manifest, scanned))
    meta = {**previous.meta, "base": base_id, "base_node": base_meta.get("node") or previous.base_node,
            "source": "rebase" if rebasing else "save", "files": files,
            "message": message or previous.message}
    meta.pop("rebased_from", None)
    if rebasing:
        meta["rebased_from"] = tip
        meta["keeps"] = marker.get("keeps") or []
    commit = write_patch_commit(store, name, parent, scanned, new_content.values(), meta, tip)
    marker.update({"head": commit, "parent": commit, "base": base_id})
    (folder / MARKER).write_text(json.dumps(marker, indent=1) + "\n")
    return SaveResult(with_warnings(store, load_patch(store, name)), True, changed)


def _excludes(config: Config, patch: Patch) -> tuple[str, ...]:
    spec = config.nodes.get(patch.base_node)
    return spec.exclude if spec is not None else DEFAULT_EXCLUDE



def unsaved_edits(store: Store, config: Config, patch: Patch) -> list[str]:
    """The files edited in the patch's checkout (``patch new``) that ``patch save`` has not
    recorded; none without a checkout (or with one that is not readable as such)."""
    folder = checkout_folder(store, patch.name)
    if not folder.is_dir():
        return []
    try:
        marker = _read_marker(folder)
        known = store.manifest(marker["parent"])
    except (UsageError, KeyError):
        return []
    scanned, _ = scan_checkout(folder, marker.get("paths") or patch.paths, known, _excludes(config, patch),
                               marker.get("umask", 0))
    return [item.path for item in changed_files(known, scanned)]


def require_clean_checkout(store: Store, config: Config, patch: Patch, folder: Path) -> None:
    marker = _read_marker(folder)
    known = store.manifest(marker["parent"])
    scanned, _ = scan_checkout(folder, marker.get("paths") or patch.paths, known, _excludes(config, patch),
                               marker.get("umask", 0))
    if marker.get("head") != patch.commit or changed_files(known, scanned):
        raise UsageError(f"{folder} holds unsaved edits of patch {patch.name!r}",
                         hint=f"save them (`snapver patch save {patch.name}`) or remove the folder, then rebase")
