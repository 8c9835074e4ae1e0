"""A write session: every new object of a command in one pack, then its refs in one move."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from snapver.errors import StoreError
from snapver.model import MANIFEST_PATH, ZERO_OID, Manifest, is_git_id
from snapver.store.gc import record_raw_bytes
from snapver.store.git import last_line, run_git
from snapver.store.lock import unwritable_store
from snapver.store.loose import Digest, LooseBlob, write_loose_blob
from snapver.store.objects import blob_oid, commit_object, tree_objects
from snapver.store.pack import BLOB_TYPE, COMMIT_TYPE, TREE_TYPE, PackWriter, object_id

if TYPE_CHECKING:
    from snapver.store.repo import Store


@dataclass(frozen=True)
class QueuedCommit:
    """A commit ``Importer.commit`` queued, written by ``finish`` (see its arguments)."""

    ref: str
    parent: str | None
    manifest: Manifest
    message: str
    when: datetime
    extra_files: dict[str, bytes]
    also_parents: tuple[str, ...]
    stored_files: dict[str, str]
    ref_at: str | None


class Importer:
    """Writes a session's new objects into one pack (``store/pack.py``), then moves its refs.

    Blobs go into the pack as they come; ``finish`` adds each queued commit's trees, its
    manifest blob and the commit itself, completes the pack, and moves every ref in one
    ``git update-ref --stdin`` transaction. Nothing is visible until then: the pack's
    index is renamed into place only once the pack is complete and on disk, and no ref
    moves unless every object its commit reaches is in the store. A write that dies
    leaves at most temporary pack files, never a ref to missing objects.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._written: set[str] = set()
        try:
            self._pack = PackWriter(store.path / "objects")
        except OSError as exc:
            raise unwritable_store(store.path, exc) from exc
        self._commits: list[QueuedCommit] = []
        self._loose: list[LooseBlob] = []  # large blobs, placed when the session finishes
        self.results: dict[int, str] = {}
        self._broken: StoreError | None = None

    def written(self) -> frozenset[str]:
        """The blobs written so far (a copy: checking thousands, one lock, not one each)."""
        with self._lock:
            return frozenset(self._written)

    def add_blob(self, data: bytes, oid: str | None = None) -> str:
        """Write a blob (once per content) and return its git id."""
        oid = oid or blob_oid(data)
        with self._lock:
            self._add(oid, data, BLOB_TYPE)
        return oid

    def add_blob_stream(self, size: int, pieces: Iterable[bytes | memoryview],
                        digests: Iterable[Digest] = ()) -> str:
        """Write a blob of ``size`` bytes that arrives in ``pieces`` (never held whole) and
        return its git id; each piece is also fed to ``digests``. It becomes a loose object
        when the session finishes (``store/loose.py``); one the store or this session has
        already is dropped. An exception from ``pieces`` leaves nothing behind."""
        if self._broken is not None:
            raise self._broken
        try:
            blob = write_loose_blob(self.store.path / "objects", size, pieces, digests)
        except OSError as exc:
            raise unwritable_store(self.store.path, exc) from exc
        except ValueError as exc:
            raise StoreError(f"a streamed blob did not match its announced size: {exc}") from exc
        oid = blob.oid
        assert oid is not None
        with self._lock:
            duplicate = oid in self._written
        if duplicate or self.store.existing([oid]):
            blob.abort()
        else:
            with self._lock:
                self._loose.append(blob)
        with self._lock:
            self._written.add(oid)
        return oid

    def _add(self, oid: str, data: bytes, kind: int) -> None:
        if self._broken is not None:
            raise self._broken
        if oid in self._written:
            return
        try:
            self._pack.add(oid, data, kind)
        except OSError as exc:
            # A half-written record would corrupt the pack: nothing more goes in.
            self._broken = unwritable_store(self.store.path, exc)
            raise self._broken from exc
        self._written.add(oid)

    def commit(self, ref: str, parent: str | None, manifest: Manifest, message: str,
               when: datetime, extra_files: dict[str, bytes] | None = None, also_parents: tuple[str, ...] = (),
               stored_files: dict[str, str] | None = None, ref_at: str | None = None) -> int:
        """Queue a commit on ``ref`` whose tree is exactly ``manifest`` (plus its text).

        ``extra_files``: further files by content; ``stored_files``: by the id of a blob
        the store has. ``also_parents``: further parents after ``parent`` (a rebased patch
        keeps its previous version reachable this way). ``ref_at``: where ``ref`` is
        expected now when that is not ``parent`` (ZERO_OID: no ref yet), e.g. one of
        ``also_parents``. Returns a mark; ``finish`` maps it to the commit id.
        """
        with self._lock:
            self._commits.append(QueuedCommit(ref, parent, manifest, message, when, dict(extra_files or {}),
                                              tuple(also_parents), dict(stored_files or {}), ref_at))
            return len(self._commits)

    def finish(self) -> dict[int, str]:
        """Write the queued commits, make every object visible, move the refs."""
        if self._broken is not None:
            self.abort()
            raise self._broken
        try:
            moves, fresh = self._commit_objects()
            with self._lock:
                for oid, kind, body in fresh:
                    self._add(oid, body, kind)
            for blob in self._loose:  # durable already (fsync'd when closed)
                blob.place()
            raw = sum(blob.bytes_written for blob in self._loose)
            self._loose = []
            if self._pack.finish() is not None or raw:
                record_raw_bytes(self.store.path, self._pack.size + raw)
        except OSError as exc:
            self.abort()
            raise unwritable_store(self.store.path, exc) from exc
        except BaseException:
            self.abort()
            raise
        if moves:
            self._move_refs(moves)
        self.store.note_present(self._written)
        return self.results

    def abort(self) -> None:
        """Drop everything written: no pack, no loose blob, no ref moves."""
        self._pack.abort()
        for blob in self._loose:
            blob.abort()
        self._loose = []

    def _commit_objects(self) -> tuple[dict[str, tuple[str, str | None]], list[tuple[str, int, bytes]]]:
        """Every queued commit with the trees and manifest blobs it needs.

        Returns ``{ref: (commit, where the ref is expected)}`` and the objects this session has not written
        yet, as (id, type, content). StoreError (nothing is visible yet) if a commit would
        name a blob or parent the store does not have.
        """
        objects: dict[str, tuple[int, bytes]] = {}  # oid -> (type, content) of trees, manifests, commits
        needed: set[str] = set()  # what the commits name that must already be in the store
        roots: dict[tuple[tuple[str, str], ...], str] = {}  # identical snapshots (a fleet) share their trees
        serialized: dict[int, bytes] = {}  # by id(): identical nodes' commits share one Manifest
        moves: dict[str, tuple[str, str | None]] = {}
        for mark, queued in enumerate(self._commits, 1):
            ref, parent, manifest, also = queued.ref, queued.parent, queued.manifest, queued.also_parents
            if id(manifest) not in serialized:
                serialized[id(manifest)] = manifest.serialize()
            files = {**queued.extra_files, MANIFEST_PATH: serialized[id(manifest)]}
            extra = {path: blob_oid(data) for path, data in files.items()}
            objects.update((oid, (BLOB_TYPE, files[path])) for path, oid in extra.items())
            for path, oid in queued.stored_files.items():
                if not is_git_id(oid) or path in extra:
                    raise StoreError(f"cannot record {ref}: {path} given as {oid!r}")
                extra[path] = oid
                needed.add(oid)
            key = tuple(sorted(extra.items()))  # the manifest's blob id names every entry
            root = roots.get(key)
            if root is None:
                leaves = [(e.path, e.git_mode, e.oid) for e in manifest.entries.values()]
                leaves += [(path, "100644", oid) for path, oid in extra.items()]
                try:
                    root, trees = tree_objects(leaves)
                except ValueError as exc:
                    raise StoreError(f"cannot record {ref}: {exc}") from exc
                objects.update((oid, (TREE_TYPE, body)) for oid, body in trees)
                needed.update(e.oid for e in manifest.entries.values())
                roots[key] = root
            for named in (parent, *also):
                if named is None:
                    continue
                if not is_git_id(named):
                    raise StoreError(f"cannot record {ref}: parent {named!r} is not a commit id")
                needed.add(named)
            body = commit_object(root, parent, queued.message, queued.when, also)
            commit = object_id(COMMIT_TYPE, body).hex()
            objects[commit] = (COMMIT_TYPE, body)
            self.results[mark] = commit
            moves[ref] = (commit, queued.ref_at or parent)
        with self._lock:
            needed -= self._written | objects.keys()
            # Trees already in the store are written again (git keeps either copy; compaction
            # drops one): asking would cost a git process, writing them far less.
            fresh = [oid for oid in objects if oid not in self._written]
        missing = sorted(needed - self.store.existing(needed))  # usually all seen already: no git process
        if missing:
            raise StoreError(f"a snapshot would name {len(missing)} object(s) the store lacks, e.g. {missing[0]}",
                             hint="nothing was recorded; run the command again")
        return moves, [(oid, *objects[oid]) for oid in fresh]

    def _move_refs(self, moves: dict[str, tuple[str, str | None]]) -> None:
        """Move every ref to its new commit at once (all or none).

        Each ref is expected at its commit's parent (absent for a root commit), or where
        ``commit(ref_at=...)`` said. One that
        is elsewhere (a scratch ref, a ref moved outside snapver) moves only forward, as
        ``git fast-import`` would move it.
        """
        if self._update_refs({ref: (new, parent or ZERO_OID) for ref, (new, parent) in moves.items()}) is None:
            return
        current = self._current_refs(list(moves))
        for ref, (new, parent) in moves.items():
            tip = current.get(ref)
            if tip not in (None, parent) and not self._contains(new, tip):
                raise StoreError(f"not updating {ref}: the new snapshot {new[:10]} does not contain its tip {tip[:10]}",
                                 hint="the ref moved while this command ran; run it again")
        error = self._update_refs({ref: (new, current.get(ref) or ZERO_OID) for ref, (new, _) in moves.items()})
        if error is not None:
            raise StoreError(f"cannot move the store's refs: {error}")

    def _update_refs(self, updates: dict[str, tuple[str, str]]) -> str | None:
        """One ``update-ref --stdin`` transaction of ``{ref: (new, expected old)}``; git's error or None."""
        lines = "".join(f"update {ref} {new} {old}\n" for ref, (new, old) in updates.items())
        result = run_git(self.store.path, "update-ref", "--stdin", input=lines.encode())
        if result.returncode == 0:
            return None
        return last_line(result.stderr, f"git update-ref exited {result.returncode}")

    def _current_refs(self, names: list[str]) -> dict[str, str]:
        out = self.store.git("for-each-ref", "--format=%(refname) %(objectname)", *names)
        found = dict(line.split(" ", 1) for line in out.decode().splitlines())
        return {name: found[name] for name in names if name in found}

    def _contains(self, commit: str, ancestor: str) -> bool:
        return run_git(self.store.path, "merge-base", "--is-ancestor", ancestor, commit).returncode == 0
