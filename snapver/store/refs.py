"""Where things live in the store, as git refs (under refs/heads so `git clone` keeps them)."""

from __future__ import annotations

import re

from snapver.errors import UsageError
from snapver.model import MAX_NAME_LENGTH

NODES = "refs/heads/nodes/"
PATCHES = "refs/heads/patches/"
PUSHES = "refs/heads/pushes/"
# Imported snapshots older than their node's newest: one ref each, beside the node's branch.
IMPORTS = "refs/heads/imports/"
DELETED_PATCHES = "refs/heads/deleted-patches/"
TAGS = "refs/tags/"
# Moves and deletions of team-wide tags over other writers' values (store/team.py), one
# commit each: which values a `tag --force` or `tag -d` overruled.
TAG_MOVES = "refs/heads/tag-moves"

# A team store (`snapver sync`): each writer publishes its own refs on the remote under
# refs/snapver/<writer>/ (refs/heads/X as X, refs/tags/T as tags/T), and every writer's
# published refs are fetched here, below TEAM. Local refs stay where they are.
REMOTE_SPACE = "refs/snapver/"
TEAM = "refs/remotes/team/"
# Where a sync fetches the remote's refs first: they move into TEAM only once checked.
INCOMING = "refs/snapver/incoming/"


def published_name(local_ref: str) -> str | None:
    """A local ref's name inside a writer's namespace (``refs/heads/nodes/a`` → ``nodes/a``,
    ``refs/tags/t`` → ``tags/t``); None for a ref that is not published."""
    if local_ref.startswith("refs/heads/"):
        return local_ref[len("refs/heads/"):]
    if local_ref.startswith(TAGS):
        return local_ref[len("refs/"):]
    return None


def local_name(published: str) -> str:
    """The local ref a published name stands for (the inverse of ``published_name``)."""
    return "refs/" + published if published.startswith("tags/") else "refs/heads/" + published


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


def deleted_patch_ref(name: str, stamp: str) -> str:
    """Where a deleted patch's history is kept (push records may name its commits)."""
    return f"{DELETED_PATCHES}{name}/{stamp}"


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


# What the ref grammar reads as a snapshot id (a hex prefix, >= 4 digits, as git).
_HEX_ID = re.compile(r"[0-9a-fA-F]{4,}")
_NAME_HINTS = {
    "tag": "letters, digits, '.', '_', '-' and '/'; no spaces, '@', '~', ':' or '..'",
    "patch": "use letters, digits, '.', '_' or '-'",
}


_WRITER = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._@+-]*")


def check_writer(name: str) -> None:
    """Refuse a writer id that cannot be one component of a ref (UsageError, exit 2)."""
    if (not _WRITER.fullmatch(name) or len(name) > MAX_NAME_LENGTH or ".." in name or "@{" in name
            or name.endswith((".lock", ".")) or name == "scratch"):
        raise UsageError(f"invalid writer id {name!r}",
                         hint="letters, digits and '.', '_', '@', '+', '-' (e.g. alice@lab), at most "
                              f"{MAX_NAME_LENGTH} characters")


def check_name(kind: str, name: str) -> None:
    """Refuse a new ``kind`` ("tag" or "patch") name the store cannot keep or refs cannot read back.

    The one check of names that users give: a valid ref component (no '@'; a patch also
    no '/'), at most MAX_NAME_LENGTH characters, and not all hex digits — a tag or patch
    ``1a2b3c4d`` would shadow the snapshot id it spells (names are looked up first).
    UsageError (exit 2) with one line otherwise.
    """
    shown = name if len(name) <= 40 else f"{name[:32]}…"
    if len(name) > MAX_NAME_LENGTH:
        raise UsageError(f"{kind} name {shown!r} is too long ({len(name)} characters)",
                         hint=f"at most {MAX_NAME_LENGTH} characters")
    if _HEX_ID.fullmatch(name):
        raise UsageError(f"invalid {kind} name {name!r}: it looks like a snapshot id (hex digits only)",
                         hint=f"a {kind} name must not read as a commit id; add a letter beyond a-f, or a '-'")
    slash_ok = kind == "tag"
    if (not valid_ref_name(name) or "@" in name or (not slash_ok and "/" in name)
            or name.startswith(("tags/", "patches/", "refs/"))):
        raise UsageError(f"invalid {kind} name {shown!r}", hint=_NAME_HINTS.get(kind))
