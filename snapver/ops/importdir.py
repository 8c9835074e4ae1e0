"""import: record a local folder (an old copy of ``srt``, an archive) as a dated snapshot.

The folder is matched to the tracked paths as a folder ref is (``folders.resolve_folder``)
and read by the local agent (``FolderTransport``), exactly as ``diff ./folder`` reads it:
links are recorded as links, never followed. The snapshot is dated ``--date`` (default:
the newest mtime of its files) and its metadata carries ``"event": "import"``.

Where it goes, so that ``NODE@DATE``, ``DATE``, ``log``, ``show`` and ``tag`` find it:

- newer than the node's newest snapshot (or the node has none): on the node's branch,
  as a pull would put it;
- older: a commit whose parent is the node's snapshot just before that date, kept by
  ``refs/heads/imports/NODE/<id>`` (``store/refs.py`` ``import_ref``) rather than the
  branch, so the branch head — ``NODE@latest`` — stays the newest pull. Date resolution
  and ``log`` read a node's history from its branch and those refs, by commit date.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import blake3

from snapver.config import Config, valid_node_name
from snapver.errors import RefError, RemotePathError, UsageError
from snapver.folders import FolderTree, resolve_folder, tracked_paths
from snapver.model import ZERO_OID, Entry, Manifest, StatEntry
from snapver.ops.snapshot import count_changes
from snapver.ops.tag import check_not_a_patch, check_tag_name
from snapver.refs import parse_day
from snapver.store import refs
from snapver.store.importer import Importer
from snapver.store.objects import blob_oid
from snapver.store.records import format_message, import_meta
from snapver.store.repo import Store
from snapver.store.team import TeamView, writer_of
from snapver.transport.base import FileChanged, StreamedFile, Transport

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}(T\d{2}:\d{2}(:\d{2})?)?$")
DATE_FORM = "YYYY-MM-DD, YYYY-MM-DDTHH:MM (local time) or may22"


@dataclass
class ImportResult:
    """What `import` recorded."""

    node: str
    commit: str
    time: datetime
    dated_by: str  # "--date", or the file whose mtime gave the date
    folder: FolderTree
    files: int
    changed: int
    parent: str | None
    head: str | None  # the node's newest snapshot after the import
    ref: str  # the ref that keeps it: the node's branch, or its own import ref
    tag: str | None = None

    @property
    def is_newest(self) -> bool:
        return self.head == self.commit

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "commit": self.commit, "time": self.time.isoformat(),
                "dated_by": self.dated_by, "folder": self.folder.to_json(), "files": self.files,
                "changed": self.changed, "parent": self.parent, "head": self.head, "ref": self.ref,
                "newest": self.is_newest, "tag": self.tag, "exit_code": 0}


def parse_import_date(text: str, now: datetime | None = None) -> datetime:
    """``--date`` as an aware local moment (a day alone: its start); exit 2 when it is not
    a date of that form, or is in the future."""
    now = now or datetime.now(timezone.utc)
    spoken = None if _DATE.match(text.strip()) else parse_day(text.strip(), now.astimezone().date())
    try:
        if spoken is not None:  # may22, as refs name the day (its start)
            moment = datetime.combine(spoken, datetime.min.time()).astimezone()
        elif not _DATE.match(text.strip()):
            raise ValueError(text)
        else:
            moment = datetime.fromisoformat(text.strip()).astimezone()
    except (ValueError, OverflowError):
        raise UsageError(f"--date {text!r} is not a date", hint=f"say {DATE_FORM}") from None
    if moment > now:
        raise UsageError(f"--date {text!r} is in the future", hint="an import records a copy that already existed")
    return moment


def _check_node_name(config: Config, node: str) -> None:
    if node in config.nodes:
        return
    if node in config.groups:
        raise UsageError(f"{node!r} is a group; an import is a snapshot of one node")
    if not (refs.valid_ref_name(node) and valid_node_name(node)):
        shown = node if len(node) <= 60 else node[:60] + "…"
        raise UsageError(f"invalid node name {shown!r}", hint="letters, digits, '.', '_' or '-', at most 100")


def _through_link_hint(folder: FolderTree, node: str) -> str:
    """Where a tracked folder that is reached through a link really is: import that."""
    site = os.path.realpath(folder.site)
    for disk, _ in folder.roots:
        real = os.path.realpath(os.path.join(folder.site, disk))
        if real != os.path.join(site, disk):
            return ("an import never reads through a link: import the folder it leads to"
                    f" (snapver import {real} --node {node})")
    return "an import never reads through a link; see `snapver import --help`"


def import_folder(store: Store, config: Config, folder_text: str, node: str, date: str | None = None,
                  tag: str | None = None, message: str = "", root: str | None = None) -> ImportResult:
    """Record the folder ``folder_text`` as a snapshot of ``node`` (see the module's docstring).

    Everything is checked (node name, date, tag, folder) before anything is written.
    """
    _check_node_name(config, node)
    moment = parse_import_date(date) if date is not None else None
    if tag is not None:
        check_tag_name(tag)
        check_not_a_patch(TeamView(store), tag)
        if existing := store.ref(refs.tag_ref(tag)):
            raise RefError(f"tag {tag!r} already names {existing[:10]}", hint="pick another name for --tag")
    head = store.ref(refs.node_ref(node))
    if node in config.nodes:
        tracked = config.nodes[node].paths
    elif head is not None:
        tracked = tuple(store.commit(head).meta.get("paths") or tracked_paths(config))
    else:
        tracked = tracked_paths(config)
    folder = resolve_folder(folder_text, config, store, root, tracked)

    from snapver.transport.local import FolderTransport

    try:
        with FolderTransport(folder.spec(), folder.roots) as transport:
            listing = transport.list_tree()
            if not listing.entries:
                raise UsageError(f"folder {folder_text} holds no files to import ({folder.describe()})",
                                 hint="an import records the files under the tracked paths; "
                                 "--root PREFIX says which one the folder is")
            dists = [[d.name, d.version] for d in transport.info.dists] if transport.info else []
            dated_by = "--date"
            if moment is None:
                moment, dated_by = _dated_by_mtime(listing.entries)
            written = _write_import(store, transport, listing.entries, node, folder, folder_text, moment, dists,
                                    message, tag)
    except RemotePathError as exc:
        raise UsageError(exc.message, hint=_through_link_hint(folder, node)) from exc
    return ImportResult(node, written.commit, moment, dated_by, folder, written.files, written.changed,
                        written.parent, written.head, written.ref, tag)


@dataclass(frozen=True)
class _Written:
    """What an import wrote: its commit, the ref keeping it, and the node's head after."""

    commit: str
    files: int
    changed: int
    parent: str | None
    head: str | None
    ref: str


def _write_import(store: Store, transport: Transport, listed: list[StatEntry], node: str, folder: FolderTree,
                  folder_text: str, moment: datetime, dists: list[list[str]], message: str,
                  tag: str | None) -> _Written:
    """Under the store lock: the folder's files and the import's commit, on the node's branch
    when it is the newest, else on a ref of its own beside it; then the tag."""
    with store.lock():
        head = store.ref(refs.node_ref(node))
        history = store.commits([head, *store.refs(f"{refs.IMPORTS}{node}/").values()]) if head else []
        newest = not history or moment >= history[0].time
        parent = head if newest else next((c.id for c in history if c.time <= moment), None)
        scratch = f"refs/snapver/scratch/import-{node}-{os.getpid()}"
        target = refs.node_ref(node) if newest else scratch
        with store.importer() as importer:
            # Each file goes into the store as it is read: the folder is never held whole.
            manifest = _store_files(store, importer, transport, listed, folder_text)
            changed = count_changes(store.manifest(parent), manifest) if parent else len(manifest)
            meta = _import_meta(store, node, folder, moment, dists, manifest, changed, message)
            subject = f"{node}: {len(manifest)} files, {changed} changed (import of {folder.text})"
            mark = importer.commit(target, parent, manifest, format_message(subject, meta, message), moment)
        commit = importer.results[mark]
        ref = target
        if not newest:
            ref = refs.import_ref(node, commit)
            try:
                store.update_ref(ref, commit)
            finally:
                store.delete_ref(scratch)
        if tag is not None:
            store.update_ref(refs.tag_ref(tag), commit, ZERO_OID)
        head = store.ref(refs.node_ref(node))
    return _Written(commit, len(manifest), changed, parent, head, ref)


def _dated_by_mtime(entries: list[StatEntry]) -> tuple[datetime, str]:
    """The import's date when ``--date`` is not given: its newest file's mtime (never later than now)."""
    newest = max(entries, key=lambda e: e.mtime_ns)
    stamp = min(newest.mtime_ns / 1e9, datetime.now(timezone.utc).timestamp())
    return (datetime.fromtimestamp(int(stamp), timezone.utc).astimezone(),
            f"the newest file's mtime ({newest.path})")


def _store_files(store: Store, importer: Importer, transport: Transport, listed: list[StatEntry],
                 folder_text: str) -> Manifest:
    """Read every listed file and write its content into the store as it arrives (a large
    file in pieces, hashed on the way, as a pull does); the manifest of what was read."""
    by_path = {entry.path: entry for entry in listed}
    present = store.existing(entry.oid for entry in listed if entry.oid)
    entries = []
    for path, kind, data in transport.stream_files(list(by_path)):
        if kind is None:
            raise UsageError(f"{path} vanished from {folder_text} while it was read; run the import again")
        if isinstance(data, StreamedFile):
            digest = blake3.blake3()
            try:
                oid = importer.add_blob_stream(data.size, data, (digest,))
            except FileChanged:
                continue  # read again: the next item is this path once more
            size = data.size
        else:
            oid, digest, size = blob_oid(data), blake3.blake3(data), len(data)
            if oid not in present:
                importer.add_blob(data, oid)
        entries.append(Entry(path, kind, by_path[path].mode, size, digest.hexdigest(), oid))
    return Manifest.of(entries)


def _import_meta(store: Store, node: str, folder: FolderTree, moment: datetime, dists: list[list[str]],
                 manifest: Manifest, changed: int, message: str) -> dict[str, Any]:
    return import_meta(node=node, writer=writer_of(store), source=str(folder.path), layout=folder.layout,
                       site_packages=folder.site, when=moment, imported=datetime.now(timezone.utc),
                       paths=folder.tracked, exclude=folder.exclude, dists=dists, manifest=manifest, changed=changed,
                       message=message)
