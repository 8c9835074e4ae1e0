"""The store: a bare git repository; ``Store`` reads its snapshots, refs and manifests.

A snapshot is a commit on ``refs/heads/nodes/<node>`` whose tree holds the tracked
paths (relative to site-packages) plus ``.snapver/manifest`` (the blake3 manifest);
its metadata is a JSON trailer in the commit message (``records.py``). Both survive
``git clone``. A write session (``Store.importer``, ``importer.py``) puts every new object
into one pack and moves refs only after that pack is complete and on disk, all in one
transaction: a write that dies half-way leaves every ref as it was.

GitPython (a dependency by design) is used where it is the natural API: creating the
repository (``Store.create``: ``git.Repo.init``, its config writer, ``HEAD``) and
``Store.repo``. Everything a command reads or writes goes through git plumbing instead,
run by ``git.py``: every git child there has a deadline, its stderr drained and its whole
session killed when it overruns (a damaged store must end a command, not hang it), which
GitPython's calls do not give; one ``cat-file --batch``, ``for-each-ref`` or
``update-ref --stdin`` does what would otherwise be one call per object or ref; and
importing GitPython would lengthen every command's start-up.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Generator, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from snapver.errors import StoreError
from snapver.model import MANIFEST_PATH, Manifest, is_git_id
from snapver.store import refs
from snapver.store.git import GitStream, last_line, run_git
from snapver.store.importer import Importer
from snapver.store.lock import store_is_locked, store_lock
from snapver.store.loose import loose_blob_pieces, open_loose
from snapver.store.records import parse_meta

# A blob above this size is read in pieces (``blob_chunks``, one git process each), never
# whole, wherever its content is only passed on or sniffed: a 2 GB .so must not need 2 GB here.
BIG_BLOB = 4 << 20
# How ``blob_chunks``'s git reads one big blob in bounded memory: git streams a packed
# blob only above core.bigFileThreshold (default 512 MiB: below it, it inflates the blob
# whole), and the pack's pages it maps stay resident up to core.packedGitLimit (default
# 8 GiB, in 1 GiB windows): both are capped here.
STREAMING = ("-c", f"core.bigFileThreshold={BIG_BLOB}", "-c", "core.packedGitWindowSize=8m",
             "-c", "core.packedGitLimit=32m")
# git's rule: a NUL in the first 8000 bytes makes a file binary (what ``blob_head`` reads).
HEAD_BYTES = 8000


@dataclass(frozen=True)
class Commit:
    """A commit as snapver reads it: id, parents, time, message and parsed metadata."""

    id: str
    parents: tuple[str, ...]
    time: datetime
    subject: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return self.id[:10]


class Store:
    """A snapver store at ``path`` (a bare git repository)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        if not ((path / "HEAD").is_file() and (path / "objects").is_dir()):
            raise StoreError(f"no snapver store at {path}", hint="run `snapver init` or `snapver pull`")
        self._repo: Any = None
        self._cat: GitStream | None = None
        self._cat_lock = threading.Lock()
        # Parsed manifests by their text: the nodes of a fleet usually share one, and a
        # manifest is never changed in place (edits build a new one).
        self._manifests: dict[bytes, Manifest] = {}
        self._manifests_lock = threading.Lock()
        # Objects seen in the repository. Git removes none a ref reaches, and compaction
        # keeps the others (repack -k): a second question about them needs no git process.
        self._present: set[str] = set()

    @property
    def repo(self) -> Any:
        """The GitPython Repo, opened on first use (importing git is slow: start-up pays it only then)."""
        if self._repo is None:
            import git

            try:
                self._repo = git.Repo(self.path)
            except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
                raise StoreError(f"no snapver store at {self.path}") from exc
        return self._repo

    # -- creating and locking ------------------------------------------------------
    @classmethod
    def create(cls, path: Path) -> Store:
        """Create an empty store (idempotent); never inside a folder that holds other things.

        The repository is made in a temporary sibling and renamed into place, so two
        commands creating the same store at once both end up using one complete store.
        """
        if (path / "HEAD").exists():
            return cls(path)
        if path.is_dir() and any(path.iterdir()):
            raise StoreError(f"cannot create the store at {path}: the folder is not empty",
                             hint="point [store] path at a new or empty folder")
        import shutil

        import git

        tmp = path.parent / f".{path.name}.creating-{os.getpid()}-{threading.get_ident()}"
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            repo = git.Repo.init(tmp, bare=True)
            with repo.config_writer() as writer:
                # Snapshots are mostly new blobs: cheap compression, gc in the background.
                writer.set_value("core", "compression", "1")
                writer.set_value("pack", "compression", "1")
                writer.set_value("gc", "auto", "0")
            repo.git.symbolic_ref("HEAD", refs.NODES + "_")
            repo.close()
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()  # an empty folder made for the store: take its place
            os.rename(tmp, path)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if (path / "HEAD").exists():  # another command created it first
                return cls(path)
            raise StoreError(f"cannot create the store at {path}: {exc.strerror or exc}") from exc
        except git.GitCommandError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise StoreError(f"cannot create the store at {path}: {exc}") from exc
        return cls(path)

    @classmethod
    def open_or_create(cls, path: Path) -> Store:
        return cls(path) if (path / "HEAD").exists() else cls.create(path)

    def lock(self, wait: float | None = None) -> Any:
        """The store's write lock (a context manager)."""
        return store_lock(self.path, wait)

    def is_locked(self) -> bool:
        """Whether a command holds the write lock now (a probe any number of threads may run)."""
        return store_is_locked(self.path)

    def close(self) -> None:
        if self._repo is not None:
            self._repo.close()
        if self._cat is not None:
            self._cat.close()
            self._cat = None

    # -- objects ------------------------------------------------------------------
    def git(self, *args: str, input: bytes | None = None) -> bytes:  # noqa: A002
        """Run one git plumbing command in the store; a failure (or a timeout) is a StoreError."""
        result = run_git(self.path, *args, input=input)
        if result.returncode != 0:
            raise StoreError(f"git {args[0]} failed: {last_line(result.stderr, str(result.returncode))}",
                             hint="`snapver fsck` checks the store")
        return result.stdout

    def note_present(self, oids: Iterable[str]) -> None:
        """Objects known to be in the store (no need to ask git): those of a snapshot that
        a ref names (a ref never moves to a commit whose objects are missing), those just
        written."""
        self._present.update(oids)

    def existing(self, oids: Iterable[str]) -> set[str]:
        """Those of ``oids`` whose object is in the store (one batched call for those not seen yet)."""
        asked = set(oids)
        known = asked & self._present
        wanted = sorted(asked - known)
        if not wanted:
            return known
        out = self.git("cat-file", "--batch-check=%(objectname) %(objecttype)",
                       input="".join(f"{oid}\n" for oid in wanted).encode())
        found = set()
        for line in out.decode().splitlines():
            name, _, kind = line.partition(" ")
            if kind and kind != "missing":
                found.add(name)
        self._present |= found
        return known | found

    def read_blob(self, oid: str) -> bytes:
        """One object's content (``oid`` or ``rev:path``), through one persistent ``cat-file --batch``.

        Our own process rather than GitPython's: no command pays for importing git.
        """
        with self._cat_lock:
            try:
                if self._cat is None or not self._cat.alive():
                    if self._cat is not None:
                        self._cat.close()
                    self._cat = GitStream(self.path, "cat-file", "--batch")
                self._cat.stdin.write(oid.encode("utf-8", "surrogateescape") + b"\n")
                self._cat.stdin.flush()
                self._cat.waiting()
                header = self._cat.stdout.readline().split()
                if len(header) != 3:
                    raise ValueError(b" ".join(header).decode("utf-8", "replace") or "no answer")
                size = int(header[2])
                data = self._cat.stdout.read(size)
                if len(data) != size or self._cat.stdout.read(1) != b"\n":
                    raise ValueError(f"read {len(data)} of {size} bytes")  # git died on a corrupt object
                self._cat.answered()
            except (ValueError, OSError) as exc:
                cat = self._cat
                if cat is not None and not (isinstance(exc, ValueError) and "missing" in str(exc)):
                    cat.close()  # out of step (or dead): start afresh next time
                    self._cat = None
                    cat.check_time()
                elif cat is not None:
                    cat.answered()
                raise StoreError(f"object {oid} is missing from the store, or corrupt",
                                 hint="run `snapver fsck`") from exc
        return data

    def read_blobs(self, oids: Iterable[str]) -> Generator[tuple[str, bytes], None, None]:
        """Stream many objects' content in one ``cat-file --batch`` process."""
        wanted = list(dict.fromkeys(oids))
        if not wanted:
            return
        stream = GitStream(self.path, "cat-file", "--batch")
        writer = threading.Thread(target=_feed, args=(stream.stdin, wanted), daemon=True)
        writer.start()
        try:
            for oid in wanted:
                stream.waiting()
                header = stream.stdout.readline().decode()
                parts = header.split()
                if len(parts) != 3:
                    stream.check_time()
                    raise StoreError(f"object {oid} is missing from the store")
                size = int(parts[2])
                data = stream.stdout.read(size)
                if len(data) != size or stream.stdout.read(1) != b"\n":
                    stream.check_time()
                    raise StoreError(f"object {oid} in the store is corrupt", hint="run `snapver fsck`")
                stream.answered()
                yield oid, data
        finally:
            stream.close()
            writer.join()

    def blob_chunks(self, oid: str, chunk: int = 1 << 20) -> Generator[bytes, None, None]:
        """One blob's content in pieces of at most ``chunk`` bytes (a large file is never held whole).

        Close it when stopping early: that ends its git process."""
        loose = open_loose(self.path / "objects" / oid[:2] / oid[2:]) if is_git_id(oid) else None
        if loose is not None:
            # git maps a loose object whole (its pages stay resident); read here, the file
            # is inflated a piece at a time.
            with loose:
                yield from loose_blob_pieces(loose, oid, chunk)
            return
        # Packed, missing, or not a plain file: git reads it, watched as cat-file --batch is
        # (a read that waits past the timeout kills it: a stalled git is not a wait forever).
        stream = GitStream(self.path, "cat-file", "blob", oid, options=STREAMING)
        finished = False
        try:
            while True:
                stream.waiting()
                piece = stream.stdout.read(chunk)
                stream.answered()
                if not piece:
                    break
                yield piece
            finished = True
        finally:
            status = stream.process.poll() if not finished else stream.process.wait()
            stream.close()  # killed if closed early (the reader stopped): its exit says nothing then
            if finished:
                stream.check_time()
                if status != 0:
                    raise StoreError(f"object {oid} is missing from the store, or corrupt", hint="run `snapver fsck`")

    def blob_head(self, oid: str, size: int = HEAD_BYTES) -> bytes:
        """The first ``size`` bytes (fewer if shorter) of a blob, without reading the rest."""
        pieces = self.blob_chunks(oid, size)
        head = b""
        try:
            for piece in pieces:  # pieces may come shorter than asked (a loose object's first)
                head += piece
                if len(head) >= size:
                    break
        finally:
            pieces.close()
        return head[:size]

    # -- refs and commits -------------------------------------------------------------
    def ref(self, name: str) -> str | None:
        """The commit a full ref name points to, or None."""
        out = run_git(self.path, "rev-parse", "-q", "--verify", name + "^{commit}")
        commit = out.stdout.decode().strip() if out.returncode == 0 else ""
        if commit:
            self._present.add(commit)
        return commit or None

    def refs(self, prefix: str) -> dict[str, str]:
        """``{name below prefix: commit}`` for every ref under ``prefix``."""
        return {name[len(prefix):]: peeled or oid for name, _kind, oid, _peeled_kind, peeled in self._ref_rows(prefix)}

    def heads(self, prefix: str) -> dict[str, str]:
        """``{full ref name: commit}`` of the refs under ``prefix`` that name a commit: what
        ``ref`` gives for each, from one git (a 16-node pull started 16)."""
        found = {}
        for name, kind, oid, peeled_kind, peeled in self._ref_rows(prefix):
            if kind == "commit" or peeled_kind == "commit":  # a tag object peeled, as ^{commit} does
                found[name] = oid if kind == "commit" else peeled
        self._present.update(found.values())
        return found

    def _ref_rows(self, prefix: str) -> list[tuple[str, str, str, str, str]]:
        """(name, object type, object, peeled type, peeled object) of each ref under ``prefix``,
        from one ``for-each-ref`` (the peeled ones empty but for annotated tags)."""
        out = self.git("for-each-ref", "--format=%(refname) %(objecttype) %(objectname) %(*objecttype) %(*objectname)",
                       prefix)
        return [tuple(line.split(" ", 4)) for line in out.decode().splitlines()]  # type: ignore[misc]

    def update_ref(self, name: str, new: str, old: str | None = None) -> None:
        args = ["update-ref", name, new] + ([old] if old is not None else [])
        self.git(*args)

    def delete_ref(self, name: str) -> None:
        self.git("update-ref", "-d", name)

    def commit(self, rev: str) -> Commit:
        """Read one commit and its snapver metadata; a StoreError when ``rev`` names no commit
        (a ref of the store pointing at a blob or a tree: damage, which fsck names)."""
        found = self.commits([rev], no_walk=True)
        if not found:
            raise StoreError(f"{rev[:40]} is not a commit: the store is damaged", hint="run `snapver fsck`")
        return found[0]

    def commits(self, revs: list[str], limit: int | None = None, no_walk: bool = False,
                first_parent: bool = False) -> list[Commit]:
        """Commits reachable from ``revs``, newest first (``git log`` order by date);
        ``first_parent``: only along first parents (a branch's own line)."""
        if not revs:
            return []
        args = ["log", "--format=%H%x00%P%x00%ct%x00%B%x00%x01", "--date-order"]
        if no_walk:
            args.append("--no-walk=unsorted")
        if first_parent:
            args.append("--first-parent")
        if limit is not None:
            args.append(f"-n{limit}")
        out = self.git(*args, *revs, "--")
        found = []
        for record in out.decode("utf-8", "surrogateescape").split("\x01"):
            record = record.lstrip("\n")
            if not record:
                continue
            oid, parents, stamp, body, _ = record.split("\x00")
            found.append(Commit(oid, tuple(parents.split()), datetime.fromtimestamp(int(stamp), timezone.utc),
                                body.splitlines()[0] if body else "", parse_meta(body)))
        return found

    def manifest(self, commit: str) -> Manifest:
        """The blake3 manifest recorded in a snapshot (or patch) commit."""
        try:
            data = self.read_blob(f"{commit}:{MANIFEST_PATH}")
        except StoreError as exc:
            raise StoreError(f"commit {commit[:10]} has no manifest ({MANIFEST_PATH})") from exc
        with self._manifests_lock:
            manifest = self._manifests.get(data)
            if manifest is None:
                try:
                    manifest = self._manifests[data] = Manifest.parse(data)
                except (ValueError, KeyError, IndexError) as exc:
                    raise StoreError(f"commit {commit[:10]}: corrupt manifest: {exc}") from exc
        return manifest

    def ls_tree(self, commit: str) -> dict[str, tuple[str, str]]:
        """``{path: (mode, oid)}`` of every blob in a commit's tree (manifest excluded)."""
        out = self.git("ls-tree", "-r", "-z", "--full-tree", commit)
        found = {}
        for record in out.split(b"\0"):
            if not record:
                continue
            head, _, path = record.partition(b"\t")
            mode, _, oid = head.decode().split(" ")
            name = path.decode("utf-8", "surrogateescape")
            if not name.startswith(".snapver/"):
                found[name] = (mode, oid)
        return found

    # -- writing ------------------------------------------------------------------
    @contextmanager
    def importer(self) -> Iterator[Importer]:
        """A write session (``Importer``); refs it writes move only if the block ends cleanly."""
        importer = Importer(self)
        try:
            yield importer
        except BaseException:
            importer.abort()
            raise
        importer.finish()


def tree_disagreements(tree: dict[str, tuple[str, str]], manifest: Manifest) -> list[str]:
    """How a commit's tree (``ls_tree``) and its manifest disagree, one sentence each; none
    when the tree is exactly the manifest (a snapshot's files are what its manifest says)."""
    problems = [f"{path!r} is in the tree but not the manifest" for path in sorted(set(tree) - set(manifest.entries))]
    for entry in manifest:
        if entry.path not in tree:
            problems.append(f"{entry.path!r} is in the manifest but not the tree")
            continue
        mode, oid = tree[entry.path]
        if oid != entry.oid or mode != entry.git_mode:
            problems.append(f"{entry.path!r}: tree entry {mode} {oid[:10]} differs from the "
                            f"manifest ({entry.git_mode} {entry.oid[:10]})")
    return problems


def _feed(pipe: Any, oids: list[str]) -> None:
    try:
        for oid in oids:
            pipe.write(f"{oid}\n".encode())
        pipe.close()
    except (OSError, ValueError):
        pass
