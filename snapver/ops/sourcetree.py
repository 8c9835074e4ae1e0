"""Known-good for an editable or source install: the commit its git checkout has at HEAD.

The node's tree is a checkout's ``python/`` (the official SGLang image: an editable install
of /sgl-workspace/sglang): no RECORD covers its files, but git committed every one of them.
The node's own git lists HEAD's blob ids for the tracked paths (``ls-tree``: objects only,
nothing written, bounded in time and output); the live listing has each file's git blob id
already, so the two compare without reading a file. Without git, or HEAD unreadable (no
commit, objects missing), the reason is a note and known-good falls back to the RECORD rules.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from snapver.errors import SnapverError
from snapver.model import ADDED, DELETED, FILE, LINK, MODIFIED, Manifest, NodeInfo, is_git_id
from snapver.ops.scope import tracked_filter
from snapver.transport.base import Transport

GIT_TIMEOUT = 20.0  # seconds for each git command on the node
TYPE_CHANGED = "T"
_KINDS = {"100644": FILE, "100755": FILE, "120000": LINK}  # a gitlink (160000) is no file


@dataclass(frozen=True)
class CommittedTree:
    """HEAD of the checkout holding a node's tree: ``{path: (kind, blob id)}`` of the tracked paths."""

    checkout: str
    commit: str
    tag: str = ""
    entries: dict[str, tuple[str, str]] = field(default_factory=dict, repr=False)
    shallow: bool = False

    @property
    def name(self) -> str:
        """``git v0.5.23``, or ``git a1b2c3d`` when no tag points at HEAD."""
        return f"git {self.tag or self.commit[:7]}"

    @property
    def label(self) -> str:
        """``git v0.5.23 (a1b2c3d)``."""
        return f"git {self.tag} ({self.commit[:7]})" if self.tag else f"git {self.commit[:7]}"


def from_checkout(info: NodeInfo | None) -> bool:
    """True when the node's tree is an editable or source install inside a git checkout."""
    install = info.install if info is not None else None
    return bool(install is not None and install.checkout and install.from_source and not info.dists)  # type: ignore[union-attr]


def request_head(transport: Transport) -> Callable[[], CommittedTree | str]:
    """Ask the node's git for HEAD now (behind any request already sent); the function
    returns the committed tree, or why it could not be read (a sentence)."""
    spec = transport.spec
    reply = transport.request("git_head", paths=list(spec.paths), timeout=GIT_TIMEOUT)

    def finish() -> CommittedTree | str:
        try:
            answer = reply()
        except SnapverError as exc:
            return exc.message.removeprefix(f"{spec.name}: ")
        return committed_tree(answer, spec.paths, spec.exclude)

    return finish


def committed_tree(answer: dict[str, Any], paths: tuple[str, ...], exclude: tuple[str, ...]) -> CommittedTree | str:
    """The agent's ``git_head`` answer as a CommittedTree (tracked, not excluded paths only), or its problem."""
    if answer.get("problem"):
        return str(answer["problem"])
    commit, rows = answer.get("commit"), answer.get("entries")
    if not isinstance(commit, str) or not is_git_id(commit) or not isinstance(rows, list):
        return "the node's git answered something unreadable"
    keep = tracked_filter(tuple(paths), tuple(exclude))
    entries: dict[str, tuple[str, str]] = {}
    for row in rows:
        if not (isinstance(row, list) and len(row) == 3 and all(isinstance(item, str) for item in row)):
            return "the node's git answered something unreadable"
        mode, oid, path = row
        if mode in _KINDS and is_git_id(oid) and keep(path):
            entries[path] = (_KINDS[mode], oid)
    if not entries:
        return f"HEAD of the checkout {answer.get('checkout')} holds none of {', '.join(paths)}"
    return CommittedTree(str(answer.get("checkout") or ""), commit, str(answer.get("tag") or ""), entries,
                         bool(answer.get("shallow")))


def compare_with_commit(tree: CommittedTree, live: Manifest) -> list[tuple[str, str]]:
    """``(path, status)`` of every path whose live state is not as committed, sorted:
    M (other content), T (a file for a link or the like), D (committed, not live), A (live only)."""
    differing: list[tuple[str, str]] = []
    for path, (kind, oid) in tree.entries.items():
        entry = live.get(path)
        if entry is None:
            differing.append((path, DELETED))
        elif entry.kind != kind:
            differing.append((path, TYPE_CHANGED))
        elif entry.oid != oid:
            differing.append((path, MODIFIED))
    differing += [(path, ADDED) for path in live.entries if path not in tree.entries]
    return sorted(differing)


def fallback_note(problem: str) -> str:
    """The note of a node in a checkout whose HEAD could not be read."""
    return f"{problem}: known-good is not the checkout's commit"


def install_line(info: NodeInfo, head: CommittedTree | str | None) -> str:
    """How ``nodes --check`` says what the node's Python found: ``sglang 0.5.23 (editable at
    /sgl-workspace/sglang/python, git v0.5.23 a1b2c3d)``; a wheel as its distributions."""
    install = info.install
    if install is None or not install.from_source or (install.how == "source" and not install.checkout
                                                        and install.found_by == "config"):
        return info.dist_summary()  # a configured tree with no checkout: nothing found to tell
    # The root said once: the site-packages line shows a configured one already.
    said = install.found_by == "config" and install.root == info.site_packages
    where = [install.how if said else f"{install.how} at {install.root}"]
    if isinstance(head, CommittedTree):
        where.append(f"git {head.tag} {head.commit[:7]}" if head.tag else f"git {head.commit[:7]}")
    elif head:
        where.append(f"no git known-good: {head}")
    return f"{install.name} {install.version or '(version unknown)'} ({', '.join(where)})"
