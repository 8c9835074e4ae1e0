"""fsck: verify the store — git's own objects, then every manifest against its content."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field

import blake3

from snapver.errors import StoreError
from snapver.store import refs
from snapver.store.repo import Store, blob_oid


@dataclass
class FsckResult:
    commits: int = 0
    blobs: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def fsck(store: Store) -> FsckResult:
    """Check every object and every manifest; report each problem found."""
    result = FsckResult()
    git_check = subprocess.run(["git", "--git-dir", str(store.path), "fsck", "--full", "--no-dangling",
                                "--no-progress"], capture_output=True, text=True)
    for line in (git_check.stdout + git_check.stderr).splitlines():
        if line.strip() and not line.startswith(("Checking", "notice:")):
            result.problems.append(f"git fsck: {line.strip()}")
    heads = [refs.NODES, refs.PATCHES]
    revs = []
    for prefix in heads:
        for name, commit in store.refs(prefix).items():
            revs.append(commit)
    for name, commit in store.refs(refs.TAGS).items():
        revs.append(commit)
    digests: dict[str, str | None] = {}
    seen = set()
    try:
        commits = store.commits(sorted(set(revs))) if revs else []
    except StoreError as exc:
        result.problems.append(str(exc))
        return result
    for commit in commits:
        if commit.id in seen or commit.meta.get("kind") not in ("snapshot", "patch"):
            continue
        seen.add(commit.id)
        result.commits += 1
        try:
            manifest = store.manifest(commit.id)
            tree = store.ls_tree(commit.id)
        except StoreError as exc:
            result.problems.append(f"snapshot {commit.short}: {exc.message}")
            continue
        for path in sorted(set(tree) - set(manifest.entries)):
            result.problems.append(f"snapshot {commit.short}: {path!r} is in the tree but not the manifest")
        for entry in manifest:
            if entry.path not in tree:
                result.problems.append(f"snapshot {commit.short}: {entry.path!r} is in the manifest but not the tree")
                continue
            mode, oid = tree[entry.path]
            if oid != entry.oid or mode != entry.git_mode:
                result.problems.append(f"snapshot {commit.short}: {entry.path!r} tree entry {mode} {oid[:10]} "
                                       f"differs from the manifest")
        missing = [e.oid for e in manifest if e.oid not in digests]
        for oid in dict.fromkeys(missing):
            try:
                data = store.read_blob(oid)
            except StoreError:
                digests[oid] = None
                continue
            digests[oid] = blake3.blake3(data).hexdigest() if blob_oid(data) == oid else "corrupt"
            result.blobs += 1
        for entry in manifest:
            actual = digests.get(entry.oid)
            if actual is None:
                result.problems.append(f"snapshot {commit.short}: {entry.path!r}: object {entry.oid[:10]} is missing")
            elif actual == "corrupt":
                result.problems.append(f"snapshot {commit.short}: {entry.path!r}: object {entry.oid[:10]} is corrupt")
            elif actual != entry.digest:
                result.problems.append(f"snapshot {commit.short}: {entry.path!r}: blake3 does not match the manifest")
    return result
