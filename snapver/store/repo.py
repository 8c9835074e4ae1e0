"""The store: a bare git repository, read with GitPython and written with fast-import.

A snapshot is a commit on ``refs/heads/nodes/<node>`` whose tree holds the tracked
paths (relative to site-packages) plus ``.snapver/manifest`` (the blake3 manifest);
its metadata is a JSON trailer in the commit message. Both survive ``git clone``.
Writes go through one ``git fast-import`` process, which makes refs visible only
when it ends cleanly: a write that dies half-way leaves every ref as it was.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Iterator

from snapver.errors import StoreError
from snapver.model import MANIFEST_PATH, Entry, Manifest, quote_path
from snapver.store import refs
from snapver.store.gc import record_raw_bytes
from snapver.store.lock import store_lock
from snapver.store.pack import PackWriter

META_PREFIX = "snapver-meta: "
IDENTITY = "snapver <snapver@localhost>"



def blob_oid(data: bytes) -> str:
    """The git blob id of ``data`` (what ``git hash-object`` prints)."""
    digest = hashlib.sha1(b"blob %d\0" % len(data), usedforsecurity=False)
    digest.update(data)
    return digest.hexdigest()


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
        self._cat: subprocess.Popen[bytes] | None = None
        self._cat_lock = threading.Lock()

    @property
    def repo(self) -> Any:
        """The GitPython Repo, opened on first use (importing git costs ~0.1 s of start-up)."""
        if self._repo is None:
            import git

            try:
                self._repo = git.Repo(self.path)
            except (git.InvalidGitRepositoryError, git.NoSuchPathError) as exc:
                raise StoreError(f"no snapver store at {self.path}") from exc
        return self._repo

    # -- creating and locking ------------------------------------------------------
    @classmethod
    def create(cls, path: Path) -> "Store":
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
    def open_or_create(cls, path: Path) -> "Store":
        return cls(path) if (path / "HEAD").exists() else cls.create(path)

    def lock(self, wait: float | None = None) -> Any:
        """The store's write lock (a context manager)."""
        return store_lock(self.path, wait)

    def close(self) -> None:
        if self._repo is not None:
            self._repo.close()
        if self._cat is not None:
            self._cat.kill()
            self._cat.wait()
            self._cat = None

    # -- objects ------------------------------------------------------------------
    def git(self, *args: str, input: bytes | None = None) -> bytes:
        """Run one git plumbing command in the store; a failure is a StoreError."""
        try:
            result = subprocess.run(["git", "--git-dir", str(self.path), *args], input=input,
                                    capture_output=True, check=False)
        except OSError as exc:
            raise StoreError(f"cannot run git: {exc}") from exc
        if result.returncode != 0:
            message = result.stderr.decode("utf-8", "replace").strip().splitlines()
            raise StoreError(f"git {args[0]} failed: {message[-1] if message else result.returncode}")
        return result.stdout

    def existing(self, oids: Iterable[str]) -> set[str]:
        """Those of ``oids`` whose object is in the store (one batched call)."""
        wanted = sorted(set(oids))
        if not wanted:
            return set()
        out = self.git("cat-file", "--batch-check=%(objectname) %(objecttype)",
                       input="".join(f"{oid}\n" for oid in wanted).encode())
        found = set()
        for line in out.decode().splitlines():
            name, _, kind = line.partition(" ")
            if kind and kind != "missing":
                found.add(name)
        return found

    def read_blob(self, oid: str) -> bytes:
        """One object's content (``oid`` or ``rev:path``), through one persistent ``cat-file --batch``.

        Our own process rather than GitPython's: importing git costs ~0.1 s of every command.
        """
        with self._cat_lock:
            try:
                if self._cat is None or self._cat.poll() is not None:
                    self._cat = subprocess.Popen(["git", "--git-dir", str(self.path), "cat-file", "--batch"],
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                                 stderr=subprocess.DEVNULL)
                assert self._cat.stdin and self._cat.stdout
                self._cat.stdin.write(oid.encode("utf-8", "surrogateescape") + b"\n")
                self._cat.stdin.flush()
                header = self._cat.stdout.readline().split()
                if len(header) != 3:
                    raise ValueError(b" ".join(header).decode("utf-8", "replace") or "no answer")
                size = int(header[2])
                data = self._cat.stdout.read(size)
                if len(data) != size or self._cat.stdout.read(1) != b"\n":
                    raise ValueError(f"read {len(data)} of {size} bytes")  # git died on a corrupt object
            except (ValueError, OSError) as exc:
                if self._cat is not None and not (isinstance(exc, ValueError) and "missing" in str(exc)):
                    self._cat.kill()  # out of step (or dead): start afresh next time
                    self._cat.wait()
                    self._cat = None
                raise StoreError(f"object {oid} is missing from the store, or corrupt",
                                 hint="run `snapver fsck`") from exc
        return data

    def read_blobs(self, oids: Iterable[str]) -> Iterator[tuple[str, bytes]]:
        """Stream many objects' content in one ``cat-file --batch`` process."""
        wanted = list(dict.fromkeys(oids))
        if not wanted:
            return
        process = subprocess.Popen(["git", "--git-dir", str(self.path), "cat-file", "--batch"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert process.stdin and process.stdout
        writer = threading.Thread(target=_feed, args=(process.stdin, wanted), daemon=True)
        writer.start()
        try:
            for oid in wanted:
                header = process.stdout.readline().decode()
                parts = header.split()
                if len(parts) != 3:
                    raise StoreError(f"object {oid} is missing from the store")
                size = int(parts[2])
                data = process.stdout.read(size)
                if len(data) != size or process.stdout.read(1) != b"\n":
                    raise StoreError(f"object {oid} in the store is corrupt", hint="run `snapver fsck`")
                yield oid, data
        finally:
            process.stdout.close()
            process.kill()
            process.wait()
            writer.join()

    # -- refs and commits -------------------------------------------------------------
    def ref(self, name: str) -> str | None:
        """The commit a full ref name points to, or None."""
        out = subprocess.run(["git", "--git-dir", str(self.path), "rev-parse", "-q", "--verify",
                              name + "^{commit}"], capture_output=True)
        return out.stdout.decode().strip() or None if out.returncode == 0 else None

    def refs(self, prefix: str) -> dict[str, str]:
        """``{name below prefix: commit}`` for every ref under ``prefix``."""
        out = self.git("for-each-ref", "--format=%(refname) %(objectname) %(*objectname)", prefix)
        found = {}
        for line in out.decode().splitlines():
            name, oid, peeled = (line.split(" ") + [""])[:3]
            found[name[len(prefix):]] = peeled or oid
        return found

    def update_ref(self, name: str, new: str, old: str | None = None) -> None:
        args = ["update-ref", name, new] + ([old] if old is not None else [])
        self.git(*args)

    def delete_ref(self, name: str) -> None:
        self.git("update-ref", "-d", name)

    def commit(self, rev: str) -> Commit:
        """Read one commit and its snapver metadata."""
        return self.commits([rev], no_walk=True)[0]

    def commits(self, revs: list[str], limit: int | None = None, no_walk: bool = False) -> list[Commit]:
        """Commits reachable from ``revs``, newest first (``git log`` order by date)."""
        if not revs:
            return []
        args = ["log", "--format=%H%x00%P%x00%ct%x00%B%x00%x01", "--date-order"]
        if no_walk:
            args.append("--no-walk=unsorted")
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
        try:
            return Manifest.parse(data)
        except (ValueError, KeyError, IndexError) as exc:
            raise StoreError(f"commit {commit[:10]}: corrupt manifest: {exc}") from exc

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
    def importer(self) -> Iterator["Importer"]:
        """A fast-import session; refs it writes appear only if the block ends cleanly."""
        importer = Importer(self)
        try:
            yield importer
        except BaseException:
            importer.abort()
            raise
        importer.finish()


def _feed(pipe: Any, oids: list[str]) -> None:
    try:
        for oid in oids:
            pipe.write(f"{oid}\n".encode())
        pipe.close()
    except (OSError, ValueError):
        pass


def parse_meta(message: str) -> dict[str, Any]:
    for line in message.splitlines():
        if line.startswith(META_PREFIX):
            try:
                return json.loads(line[len(META_PREFIX):])
            except json.JSONDecodeError:
                return {}
    return {}


def format_message(subject: str, meta: dict[str, Any], body: str = "") -> str:
    text = subject.strip() + "\n\n"
    if body.strip():
        text += body.strip() + "\n\n"
    return text + META_PREFIX + json.dumps(meta, ensure_ascii=True, sort_keys=True, separators=(",", ":")) + "\n"


class Importer:
    """Writes new blobs into one pack (``store/pack.py``), then commits with ``git fast-import``.

    Nothing is visible until ``finish``: the pack's index is renamed into place only
    once the pack is complete, and refs move only when fast-import ends cleanly. A write
    that dies leaves at most a temporary pack file, never a ref to missing objects.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._written: set[str] = set()
        self._pack = PackWriter(store.path / "objects")
        self._commits: list[tuple[str, str | None, Manifest, str, datetime, dict[str, bytes]]] = []
        self.results: dict[int, str] = {}
        self._broken: StoreError | None = None

    def has(self, oid: str) -> bool:
        with self._lock:
            return oid in self._written

    def add_blob(self, data: bytes, oid: str | None = None) -> str:
        """Write a blob (once per content) and return its git id."""
        oid = oid or blob_oid(data)
        with self._lock:
            if self._broken is not None:
                raise self._broken
            if oid not in self._written:
                try:
                    self._pack.add(oid, data)
                except OSError as exc:
                    # A half-written record would corrupt the pack: nothing more goes in.
                    self._broken = StoreError(f"cannot write to the store {self.store.path}: {exc.strerror or exc}")
                    raise self._broken from exc
                self._written.add(oid)
        return oid

    def commit(self, ref: str, parent: str | None, manifest: Manifest, message: str,
               when: datetime, extra_files: dict[str, bytes] | None = None) -> int:
        """Queue a commit on ``ref`` whose tree is exactly ``manifest`` (plus its text).

        Returns a mark; ``finish`` maps it to the commit id.
        """
        with self._lock:
            self._commits.append((ref, parent, manifest, message, when, dict(extra_files or {})))
            return len(self._commits)

    def finish(self) -> dict[int, str]:
        """Make the blobs visible, write the queued commits, move their refs."""
        if self._broken is not None:
            self._pack.abort()
            raise self._broken
        try:
            if self._pack.finish() is not None:
                record_raw_bytes(self.store.path, self._pack.size)
        except OSError as exc:
            self._pack.abort()
            raise StoreError(f"cannot write to the store: {exc}") from exc
        if not self._commits:
            return self.results
        stream = [b"feature done\n"]
        for mark, (ref, parent, manifest, message, when, files) in enumerate(self._commits, 1):
            stream.append(_commit_command(mark, ref, parent, manifest, message, when, files))
        stream += [b"get-mark :%d\n" % mark for mark in range(1, len(self._commits) + 1)]
        stream.append(b"done\n")
        try:
            result = subprocess.run(
                ["git", "--git-dir", str(self.store.path), "fast-import", "--quiet", "--done"],
                input=b"".join(stream), capture_output=True, check=False)
        except OSError as exc:
            raise StoreError(f"cannot run git fast-import: {exc}") from exc
        if result.returncode != 0:
            lines = result.stderr.decode("utf-8", "replace").strip().splitlines()
            raise StoreError(f"git fast-import failed: {lines[0] if lines else result.returncode}")
        ids = result.stdout.decode().split()
        self.results = {mark: oid for mark, oid in enumerate(ids, 1)}
        return self.results

    def abort(self) -> None:
        """Drop everything written: no pack, no ref moves."""
        self._pack.abort()


def _commit_command(mark: int, ref: str, parent: str | None, manifest: Manifest, message: str,
                    when: datetime, files: dict[str, bytes]) -> bytes:
    files = {**files, MANIFEST_PATH: manifest.serialize()}
    stamp = int(when.timestamp())
    offset = when.astimezone().utcoffset()
    minutes = int(offset.total_seconds() // 60) if offset else 0
    tz = f"{'+' if minutes >= 0 else '-'}{abs(minutes) // 60:02d}{abs(minutes) % 60:02d}"
    text = message.encode("utf-8", "surrogateescape")
    lines = [b"commit %s\nmark :%d\ncommitter %s %d %s\ndata %d\n" % (
        ref.encode(), mark, IDENTITY.encode(), stamp, tz.encode(), len(text)), text, b"\n"]
    if parent:
        lines.append(b"from %s\n" % parent.encode())
    lines.append(b"deleteall\n")
    for entry in manifest:
        lines.append(f"M {entry.git_mode} {entry.oid} {quote_path(entry.path)}\n".encode("utf-8", "surrogateescape"))
    for path, data in sorted(files.items()):
        lines.append(b"M 100644 inline %s\ndata %d\n" % (quote_path(path).encode(), len(data)))
        lines.append(data + b"\n")
    lines.append(b"\n")
    return b"".join(lines)
