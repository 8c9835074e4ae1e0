"""Carrying a patch onto a new base, three-way per file (`patch rebase`)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from snapver.config import Config
from snapver.errors import PatchError
from snapver.model import FILE, Entry
from snapver.ops.patch.checkout import checkout_folder, require_clean_checkout, write_checkout
from snapver.ops.patch.model import (
    Patch,
    build_tree,
    changed_files,
    entry_for,
    load_patch,
    patch_meta,
    resolve_base,
    with_warnings,
    write_patch_commit,
)
from snapver.ops.pristine import recorded, shipped
from snapver.store.git import git_timeout
from snapver.store.repo import Store


@dataclass(frozen=True)
class RebasedFile:
    path: str
    # "clean", "merged", "dropped" (already in the new base), "kept" (there only as a leftover), "conflict"
    outcome: str
    detail: str = ""


@dataclass
class RebaseResult:
    patch: Patch
    onto: str
    files: list[RebasedFile]
    rebased: bool
    checkout: Path | None = None  # where the conflicts wait to be resolved

    @property
    def conflicts(self) -> list[RebasedFile]:
        return [f for f in self.files if f.outcome == "conflict"]


def _merge3(ours: bytes, base: bytes, theirs: bytes, labels: tuple[str, str, str]) -> tuple[bytes, int]:
    """Three-way merge of one file with `git merge-file`: (result, number of conflicts)."""
    with tempfile.TemporaryDirectory(prefix="snapver-merge-") as tmp:
        names = []
        for label, data in zip(("ours", "base", "theirs"), (ours, base, theirs), strict=False):
            path = os.path.join(tmp, label)
            with open(path, "wb") as handle:
                handle.write(data)
            names.append(path)
        try:
            result = subprocess.run(["git", "merge-file", "-p", "-L", labels[0], "-L", labels[1], "-L", labels[2],
                                     *names], capture_output=True, timeout=git_timeout(), start_new_session=True)
        except subprocess.TimeoutExpired as exc:
            raise PatchError(f"git merge-file did not finish within {exc.timeout:g} s") from exc
    if result.returncode < 0 or result.returncode > 127:
        raise PatchError(f"git merge-file failed: {result.stderr.decode('utf-8', 'replace').strip()}")
    return result.stdout, result.returncode


def rebase_patch(store: Store, config: Config, name: str, onto_ref: str) -> RebaseResult:
    """Carry a patch onto a new base, three-way per file.

    Clean: a new patch commit on the new base. Conflicts: nothing is recorded; the
    merged tree, conflict markers included, is checked out for editing and
    `patch save` finishes the rebase. A conflict markers cannot show (modify/delete,
    binary, symlink) is checked out as the patch has it, so a save never drops the
    patch's side of it unseen.
    """
    patch = load_patch(store, name)
    onto = resolve_base(store, config, onto_ref)
    if onto.commit == patch.base:
        return RebaseResult(patch, onto.commit, [], False)
    labels = (name, f"base {patch.base[:10]}", f"onto {onto.commit[:10]}")
    shipped_rows = recorded(store, onto.commit)
    keeps: list[str] = []
    results: list[RebasedFile] = []
    changes: dict[str, tuple[Entry | None, bytes | None]] = {}
    overrides: dict[str, bytes] = {}
    for item in patch.files:
        new_base = onto.manifest.get(item.path)
        old, mine = item.base, item.patch
        if _entry_key(new_base) == _entry_key(mine) and old is None and mine is not None and mine.kind == FILE \
                and not shipped(shipped_rows, mine, store.read_blob(mine.oid)):
            # The new base has the added file, but not as a file of its release (pip leaves
            # what RECORD does not list): keep adding it, or a fresh node never gets it.
            keeps.append(item.path)
            results.append(RebasedFile(item.path, "kept", "in the new base only as a leftover"
                                       if shipped_rows is not None else
                                       "in the new base, which has no RECORD saying it ships it"))
        elif _entry_key(new_base) == _entry_key(mine):
            results.append(RebasedFile(item.path, "dropped", "the new base already has it"))
        elif _entry_key(new_base) == _entry_key(old):
            results.append(RebasedFile(item.path, "clean"))
            changes[item.path] = (mine, None)
        elif old is None or mine is None or new_base is None or FILE != old.kind or mine.kind != FILE \
                or new_base.kind != FILE:
            what = ("added by the patch and by the new base" if old is None else
                    "deleted by the patch, changed in the new base" if mine is None else
                    "changed by the patch, deleted in the new base" if new_base is None else "not a plain file")
            if mine is not None and new_base is not None and mine.kind == FILE == new_base.kind:
                merged, _ = _merge3(store.read_blob(mine.oid), b"", store.read_blob(new_base.oid), labels)
                overrides[item.path] = merged
                changes[item.path] = (entry_for(item.path, FILE, mine.mode, merged), merged)
            else:
                # No markers can hold both sides: the checkout holds the patch's (its file, or
                # none where it deletes), so a save leaves the patch's change in unless edited.
                changes[item.path] = (mine, None)
                what += (f"; left deleted in the checkout (the new base's: `snapver show {onto.commit[:10]} "
                         f"{item.path}`)" if mine is None else "; the patch's version is checked out")
            results.append(RebasedFile(item.path, "conflict", what))
        else:
            datas = [store.read_blob(e.oid) for e in (mine, old, new_base)]
            if any(b"\0" in d for d in datas):
                results.append(RebasedFile(item.path, "conflict", "binary content changed on both sides; "
                                           "the patch's version is checked out"))
                changes[item.path] = (mine, None)  # the patch's side, as above
                continue
            merged, conflicts = _merge3(datas[0], datas[1], datas[2], labels)
            mode = mine.mode if stat.S_IMODE(mine.mode) != stat.S_IMODE(old.mode) else new_base.mode
            entry = entry_for(item.path, FILE, mode, merged)
            changes[item.path] = (entry, merged)
            if conflicts:
                results.append(RebasedFile(item.path, "conflict", f"{conflicts} conflicting hunk(s)"))
                overrides[item.path] = merged
            else:
                results.append(RebasedFile(item.path, "merged"))
    manifest, blobs = build_tree(onto.manifest, changes)
    if any(r.outcome == "conflict" for r in results):
        folder = checkout_folder(store, name)
        if folder.exists():
            require_clean_checkout(store, config, patch, folder)
            shutil.rmtree(folder)
        marker = {"name": name, "store": str(store.path), "head": patch.commit, "parent": onto.commit,
                  "base": onto.commit, "paths": list(onto.paths), "rebasing": True, "keeps": keeps}
        full = {p: d for p, (e, d) in changes.items() if e is not None and d is not None}
        write_checkout(store, folder, manifest, marker, {**full, **overrides})
        return RebaseResult(patch, onto.commit, results, False, folder)
    files = len(changed_files(onto.manifest, manifest))
    meta = {**patch.meta, **patch_meta(onto, patch.nodes, patch.message, "rebase", files + len(keeps)),
            "rebased_from": patch.commit, "keeps": keeps}
    write_patch_commit(store, name, onto.commit, manifest, blobs, meta, patch.commit)
    return RebaseResult(with_warnings(store, load_patch(store, name)), onto.commit, results, True)


def _entry_key(entry: Entry | None) -> tuple[str, str, int] | None:
    if entry is None:
        return None
    return entry.kind, entry.oid, stat.S_IMODE(entry.mode) if entry.kind == FILE else 0
