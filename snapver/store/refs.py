"""Where things live in the store, as git refs (under refs/heads so `git clone` keeps them)."""

from __future__ import annotations

NODES = "refs/heads/nodes/"
PATCHES = "refs/heads/patches/"
PUSHES = "refs/heads/pushes/"
TAGS = "refs/tags/"


def node_ref(node: str) -> str:
    """The branch holding a node's snapshot history, newest at its tip."""
    return NODES + node


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
