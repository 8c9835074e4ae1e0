"""Where things live in the store, as git refs (under refs/heads so `git clone` keeps them)."""

from __future__ import annotations

NODES = "refs/heads/nodes/"
PATCHES = "refs/heads/patches/"
PUSHES = "refs/heads/pushes/"
# Imported snapshots older than their node's newest: one ref each, beside the node's branch.
IMPORTS = "refs/heads/imports/"
TAGS = "refs/tags/"


def node_ref(node: str) -> str:
    """The branch holding a node's snapshot history, newest at its tip."""
    return NODES + node


def import_ref(node: str, commit: str) -> str:
    """The ref keeping an imported snapshot that is older than its node's newest one.

    Such a snapshot is a commit whose parent is the node's snapshot just before its
    date (so it sits in date order), kept by this ref rather than the node's branch, so
    the branch head (``NODE@latest``) stays the newest snapshot. Date resolution and
    ``log`` read a node's history from its branch and these refs.
    """
    return f"{IMPORTS}{node}/{commit}"


def patch_ref(name: str) -> str:
    return PATCHES + name


def push_ref(node: str) -> str:
    """The branch of push records for a node (one commit per push or rollback)."""
    return PUSHES + node


def tag_ref(name: str) -> str:
    return TAGS + name


def valid_ref_name(name: str) -> bool:
    """A name git accepts as one ref component and that cannot be read as an option."""
    bad = (" ", "~", "^", ":", "?", "*", "[", "\\", "..", "@{", "//")
    return (bool(name) and not name.startswith(("-", ".", "/")) and not name.endswith((".lock", "/", "."))
            and not any(token in name for token in bad) and all(32 < ord(ch) < 127 for ch in name))
