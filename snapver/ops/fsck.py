"""fsck: verify the store — git's own check, every ref, then every manifest against its content.

Each problem names what is wrong and where: the ref, the snapshot, the path, the object.
Objects are read through ``git cat-file --batch`` processes of our own, restarted after a
corrupt object ends one, so one bad object never hides the rest (nor crashes the check).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import blake3

from snapver.errors import GitTimeoutError, StoreError
from snapver.model import MANIFEST_PATH, Manifest, is_git_id
from snapver.store.gc import compaction_paused
from snapver.store.git import GitStream, run_git
from snapver.store.objects import blob_oid
from snapver.store.pack import GIT_TEMP_PREFIXES
from snapver.store.records import MANIFEST_KINDS
from snapver.store.repo import Commit, Store, tree_disagreements

# Refs whose commits carry a manifest: what each kind of ref is called in a problem.
_REF_KINDS = (("refs/heads/nodes/", "snapshot"), ("refs/heads/patches/", "patch"),
              ("refs/heads/pushes/", "push record"), ("refs/tags/", "tag"))


@dataclass
class FsckResult:
    commits: int = 0  # commits with a manifest, checked: snapshots, patch commits, push records
    blobs: int = 0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # commits checked by kind ("snapshot", "patch", "push"): `log` lists the snapshots
    kinds: dict[str, int] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {"ok": self.ok, "snapshots": self.kinds.get("snapshot", 0),
                "patch_commits": self.kinds.get("patch", 0), "push_records": self.kinds.get("push", 0),
                "commits": self.commits, "blobs": self.blobs, "problems": self.problems, "notes": self.notes}

    @property
    def ok(self) -> bool:
        return not self.problems


def fsck(store: Store) -> FsckResult:
    """Check every object, ref and manifest of the store; report each problem found.

    Every git process it starts is bounded in time (``SNAPVER_GIT_TIMEOUT``): one that
    hangs on the damage it meets ends the check with a GitTimeoutError (exit 4).
    """
    with compaction_paused(store.path):
        return _fsck(store)


def _fsck(store: Store) -> FsckResult:
    result = FsckResult()
    _git_fsck(store, result)
    tips = _check_refs(store, result)
    commits = _commits(store, tips, result)
    _check_named_commits(store, commits, result)
    manifests: list[tuple[Commit, Manifest]] = []
    with_manifest = [c.id for c in commits if c.meta.get("kind") in MANIFEST_KINDS]
    found = _batch_check(store, "%(objectname)", [f"{commit}:{MANIFEST_PATH}" for commit in with_manifest])
    manifest_oids = {commit: found[f"{commit}:{MANIFEST_PATH}"] for commit in with_manifest}
    read = dict(_read_objects(store.path, [oid for oid in manifest_oids.values() if oid and oid != UNREADABLE]))
    for commit in commits:
        if commit.id not in manifest_oids:
            continue
        label = _label(commit)
        oid = manifest_oids[commit.id]
        data = read.get(oid) if oid else None
        if manifest_oids[commit.id] == UNREADABLE:
            result.problems.append(f"{label}: its tree cannot be read (corrupt)")
            continue
        if not isinstance(data, bytes):
            why = "is missing" if manifest_oids[commit.id] is None else f"cannot be read ({data})"
            result.problems.append(f"{label}: its manifest {MANIFEST_PATH} {why}")
            continue
        try:
            manifest = Manifest.parse(data)
        except (ValueError, KeyError, IndexError, UnicodeError) as exc:
            result.problems.append(f"{label}: its manifest cannot be parsed: {exc}")
            continue
        result.commits += 1
        kind = commit.meta["kind"]
        result.kinds[kind] = result.kinds.get(kind, 0) + 1
        manifests.append((commit, manifest))
        _check_tree(store, commit, manifest, label, result)
    _check_content(store, manifests, result)
    _note_temp_packs(store.path, result)
    return result


# The commits a record or a patch names in its metadata: each must stay in the store.
_NAMED = {"push": ("patch_commit", "base", "before", "after", "restore", "target"), "patch": ("base", "rebased_from")}


def _check_named_commits(store: Store, commits: list[Commit], result: FsckResult) -> None:
    """Every commit a push record or patch names must exist and be reachable from a ref
    (else `git gc` deletes it, and rollback or history lose it)."""
    reachable = {commit.id for commit in commits}
    named = [(commit, key, str(commit.meta.get(key))) for commit in commits
             for key in _NAMED.get(str(commit.meta.get("kind")), ())
             if is_git_id(str(commit.meta.get(key))) and str(commit.meta.get(key)) not in reachable]
    if not named:
        return
    found = _batch_check(store, "%(objecttype)", sorted({oid for _, _, oid in named}))
    for commit, key, oid in named:
        why = "which is not in the store" if found.get(oid) is None else "which no ref keeps (`git gc` would delete it)"
        result.problems.append(f"{_label(commit)} names {key} {oid[:10]}, {why}")


def _label(commit: Commit) -> str:
    kind = {"snapshot": "snapshot", "patch": "patch", "push": "push record"}[commit.meta["kind"]]
    owner = commit.meta.get("node") or commit.meta.get("name") or ""
    return f"{kind} {commit.short}" + (f" ({owner})" if owner else "")


def _git_fsck(store: Store, result: FsckResult) -> None:
    check = run_git(store.path, "fsck", "--full", "--no-dangling", "--no-progress")
    output = (check.stdout + check.stderr).decode("utf-8", "replace")
    for line in output.splitlines():
        if line.strip() and not line.startswith(("Checking", "notice:")):
            result.problems.append(f"git fsck: {line.strip()}")
    if check.returncode != 0 and not result.problems:
        result.problems.append(f"git fsck failed with exit {check.returncode}")


def _check_refs(store: Store, result: FsckResult) -> list[str]:
    """Every ref must name an object the store has; returns the refs that name commits."""
    out = store.git("for-each-ref", "--format=%(refname) %(objectname)", "refs/")
    refs = dict(line.split(" ", 1) for line in out.decode("utf-8", "surrogateescape").splitlines() if line)
    refs = {name: oid for name, oid in refs.items() if not name.startswith("refs/snapver/")}  # scratch refs
    found = _batch_check(store, "%(objecttype)", [*refs.values(), *(f"{oid}^{{commit}}" for oid in refs.values())])
    tips = []
    for name, oid in sorted(refs.items()):
        what = next((kind + " " for prefix, kind in _REF_KINDS if name.startswith(prefix)), "")
        if found[oid] is None:
            result.problems.append(f"ref {name} points to {oid[:10]}, which is not in the store "
                                   f"(a dangling {what}ref)")
        elif UNREADABLE in (found[oid], found[f"{oid}^{{commit}}"]):
            result.problems.append(f"ref {name} points to {oid[:10]}, which git cannot read (corrupt)")
        elif found[f"{oid}^{{commit}}"] != "commit":
            result.problems.append(f"ref {name} points to {oid[:10]}, a {found[oid]}, not a commit")
        else:
            tips.append(name)
    return tips


UNREADABLE = "unreadable"  # what _batch_check says of a name git dies on (a corrupt object on its way)


def _batch_check(store: Store, format: str, names: list[str]) -> dict[str, str | None]:
    """``{name: what format says, or None if missing}`` for object names (``oid``, ``rev:path``…).

    git stops at the first corrupt object it meets; then each name is looked at on its own,
    and those git dies on are ``UNREADABLE``."""
    if not names:
        return {}
    try:
        out = store.git("cat-file", f"--batch-check={format}", input="".join(f"{n}\n" for n in names).encode())
    except GitTimeoutError:
        raise  # a hang is not a corrupt object: asking again, name by name, would hang as often
    except StoreError:
        if len(names) == 1:
            return {names[0]: UNREADABLE}
        return {name: found for one in names for name, found in _batch_check(store, format, [one]).items()}
    return {name: None if line.endswith((" missing", " ambiguous")) else line.strip()
            for name, line in zip(names, out.decode("utf-8", "surrogateescape").splitlines(), strict=False)}


def _commits(store: Store, tips: list[str], result: FsckResult) -> list[Commit]:
    """Every commit reachable from ``tips``; a broken history is a problem, the rest still checked."""
    try:
        return store.commits(tips) if tips else []
    except GitTimeoutError:
        raise
    except StoreError:
        pass
    found: dict[str, Commit] = {}
    for tip in tips:
        try:
            commits = store.commits([tip])
        except GitTimeoutError:
            raise
        except StoreError as exc:
            result.problems.append(f"ref {tip}: its history cannot be read: {exc.message}")
            try:
                commits = store.commits([tip], no_walk=True)
            except StoreError:
                continue
        for commit in commits:
            found.setdefault(commit.id, commit)
    return sorted(found.values(), key=lambda c: c.time, reverse=True)


def _check_tree(store: Store, commit: Commit, manifest: Manifest, label: str, result: FsckResult) -> None:
    try:
        tree = store.ls_tree(commit.id)
    except GitTimeoutError:
        raise
    except StoreError as exc:
        result.problems.append(f"{label}: its tree cannot be read: {exc.message}")
        return
    result.problems.extend(f"{label}: {problem}" for problem in tree_disagreements(tree, manifest))


def _check_content(store: Store, manifests: list[tuple[Commit, Manifest]], result: FsckResult) -> None:
    """Read every blob a manifest names once: its git id, size and blake3 must match."""
    wanted = list(dict.fromkeys(entry.oid for _, manifest in manifests for entry in manifest))
    facts: dict[str, tuple[int, str] | str] = {}
    for oid, data in _read_objects(store.path, wanted):
        if isinstance(data, str):
            facts[oid] = data
        elif blob_oid(data) != oid:
            facts[oid] = "corrupt (its content does not hash to its id)"
        else:
            facts[oid] = (len(data), blake3.blake3(data).hexdigest())
            result.blobs += 1
    for commit, manifest in manifests:
        label = _label(commit)
        for entry in manifest:
            fact = facts.get(entry.oid, "missing")
            if isinstance(fact, str):
                result.problems.append(f"{label}: {entry.path!r}: object {entry.oid} is {fact}")
            elif fact[1] != entry.digest:
                result.problems.append(f"{label}: {entry.path!r}: blake3 {fact[1][:16]} does not match the "
                                       f"manifest's {entry.digest[:16]}")
            elif fact[0] != entry.size:
                result.problems.append(f"{label}: {entry.path!r}: size {fact[0]} does not match the "
                                       f"manifest's {entry.size}")


def _read_objects(git_dir: Path, oids: list[str]) -> Iterator[tuple[str, bytes | str]]:
    """``(oid, content)`` for each object, or ``(oid, why not)``: "missing", or "corrupt (…)"
    when git could not read it. A ``cat-file`` that dies on a corrupt object is restarted
    after it, so every object gets an answer; one that stops answering (GitStream's
    timeout) ends the check with a GitTimeoutError."""
    pending = list(oids)
    while pending:
        stream = GitStream(git_dir, "cat-file", "--batch")
        feeder = threading.Thread(target=_feed, args=(stream.stdin, pending), daemon=True)
        feeder.start()
        done = 0
        try:
            for oid in pending:
                stream.waiting()
                header = stream.stdout.readline().split()
                if len(header) == 2 and header[1] == b"missing":
                    yield oid, "missing"
                elif len(header) == 3:
                    data = stream.stdout.read(int(header[2]))
                    if len(data) != int(header[2]) or stream.stdout.read(1) != b"\n":
                        break
                    yield oid, data
                else:
                    break
                stream.answered()
                done += 1
        finally:
            stream.close()
            feeder.join()
        stream.check_time()
        if done < len(pending):
            yield pending[done], f"corrupt ({stream.error('git cat-file could not read it')})"
            done += 1
        pending = pending[done:]


def _feed(pipe: IO[bytes], oids: list[str]) -> None:
    try:
        for oid in oids:
            pipe.write(f"{oid}\n".encode())
        pipe.close()
    except (OSError, ValueError):
        pass  # cat-file died on a corrupt object; the reader restarts it


def _note_temp_packs(git_dir: Path, result: FsckResult) -> None:
    # Temporary packs a killed writer left (ours, see store/pack.py; git's, of a compaction).
    pack_dir = git_dir / "objects" / "pack"
    leftovers = [path for path in pack_dir.iterdir() if path.name.startswith(GIT_TEMP_PREFIXES)] \
        if pack_dir.is_dir() else []
    if leftovers:
        size = sum(path.stat().st_size for path in leftovers if path.exists())
        result.notes.append(f"{len(leftovers)} unfinished pack file(s) ({size} bytes) left by interrupted "
                            "writes: never visible, removed by a later write or compaction")
