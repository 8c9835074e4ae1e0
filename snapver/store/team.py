"""A team store: writer ids, `sync` through any git remote, and reads that merge every writer.

Every store has a writer id (``user@host``, in the store's git config). `sync` fetches
every writer's published refs (``refs/snapver/<writer>/...`` on the remote) into
``refs/remotes/team/<writer>/...`` here, then publishes this store's own refs under its
own writer's namespace with one ``git push --atomic``, each ref guarded by
``--force-with-lease`` at the value the remote was just seen to hold. No two writers ever
write the same ref, so a sync never conflicts; only a second store using the same writer
id (or a remote that refuses) can make it fail, and then nothing moved.

Reading merges the writers (``TeamView``): a node's newest snapshot is the newest of
anyone's; its history is everyone's; a tag is team-wide (two values are a conflict, see
``TeamView.tags``); a patch's current version is the one that contains every other.
Local refs are never rewritten by a sync: nothing is lost here, whatever the remote does.
"""

from __future__ import annotations

import getpass
import heapq
import math
import os
import re
import shlex
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from snapver.errors import GitTimeoutError, RefError, RemoteError, StoreError
from snapver.model import ZERO_OID
from snapver.store import refs
from snapver.store.git import git_timeout, last_line, run_git
from snapver.store.pack import GIT_TEMP_PREFIXES, remove_dead_writers_packs
from snapver.store.records import MANIFEST_KINDS
from snapver.store.repo import Commit, Store, tree_disagreements

WRITER_KEY = "snapver.writer"
# Set after a store's first sync: from then on a ref deleted here is deleted on the remote.
SYNCED_KEY = "snapver.synced"
# Auto-sync (`[store] sync = "auto"`) gives git this long; an explicit `sync` git's usual limit.
AUTO_SYNC_TIMEOUT = 10.0
# What git's ssh is given: seconds to connect and between keepalives (at most git's own
# limit), and the keepalives unanswered in a row that end it (OpenSSH's ServerAliveCountMax).
SSH_CONNECT_TIMEOUT = 10
SSH_ALIVE_MISSES = 3
# git must never ask for a password on the terminal: credentials are the user's agent's affair.
GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "", "GCM_INTERACTIVE": "never"}
# How a store that has never synced names its own writer in a TeamView (no other is there).
LOCAL_WRITER = "(this store)"
_TEAM_SHORT = refs.TEAM[len("refs/"):]  # "remotes/team/", as Store.refs("refs/") names them


def commit_moment(commit: Commit) -> int:
    """When a commit was recorded: its meta's ``time_ns``, else its commit time (whole
    seconds: git's). Two writers' records of one node in the same second (a rollback
    right after the push it undoes) are ordered by it, not by writer id."""
    stamp = commit.meta.get("time_ns")
    if isinstance(stamp, int) and not isinstance(stamp, bool):
        return stamp
    return int(commit.time.timestamp()) * 1_000_000_000


def default_writer() -> str:
    """``user@host`` of this login and machine, made a valid writer id."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "user"
    host = socket.gethostname().split(".")[0] or "host"
    return re.sub(r"[^A-Za-z0-9._+-]", "-", user).lstrip(".-") + "@" + re.sub(r"[^A-Za-z0-9._+-]", "-", host)


def _config_get(store: Store, key: str) -> str | None:
    result = run_git(store.path, "config", "--get", key)
    return result.stdout.decode().strip() or None if result.returncode == 0 else None


def _config_all(store: Store) -> dict[str, str]:
    """The store's ``snapver.*`` settings, in one git call."""
    result = run_git(store.path, "config", "--get-regexp", r"^snapver\.")
    found = {}
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        key, _, value = line.partition(" ")
        found[key] = value
    return found


def writer_of(store: Store) -> str:
    """This store's writer id (``snapver.writer``), else ``default_writer()``."""
    cached = getattr(store, "_team_writer", None)
    if cached is None:
        cached = _config_get(store, WRITER_KEY) or default_writer()
        store._team_writer = cached  # type: ignore[attr-defined]
    return cached


def set_writer(store: Store, name: str) -> None:
    """Set the store's writer id (checked: one ref component)."""
    refs.check_writer(name)
    store.git("config", WRITER_KEY, name)
    store._team_writer = name  # type: ignore[attr-defined]


def ensure_writer(store: Store) -> str:
    """The writer id, written into the store's config if it was only the default."""
    if _config_get(store, WRITER_KEY) is None:
        set_writer(store, default_writer())
    return writer_of(store)


_TIE_MARGIN = 32
# A teammate's time further ahead of this machine's clock than this is flagged by `sync`.
FUTURE_MARGIN = 600.0


def _ties_by_moment(commits: list[Commit]) -> list[Commit]:
    """git's ``--date-order`` (whole seconds), each run of one second put newest first by
    ``commit_moment``: two nodes pulled in one second came out in git's order, so ``log``
    could show the older first. A run is left as git gave it if that would put a commit
    after one of its own parents (a clock set back)."""
    ordered: list[Commit] = []
    start = 0
    while start < len(commits):
        end = start + 1
        while end < len(commits) and commits[end].time == commits[start].time:
            end += 1
        run = commits[start:end]
        if len(run) > 1:
            by_moment = sorted(run, key=lambda commit: -commit_moment(commit))
            seen: set[str] = set()
            for commit in by_moment:
                if seen.intersection(commit.parents):  # a parent of this one came first
                    break
                seen.add(commit.id)
            else:
                run = by_moment
        ordered += run
        start = end
    return ordered


def _writer(commit: Commit) -> str:
    return str(commit.meta.get("writer") or "")


def _by_ancestry(commits: list[Commit]) -> list[Commit]:
    """A team's snapshots newest first as ``NODE@latest`` orders them: never a commit before
    one of its children (a snapshot comes after every snapshot its writer saw when taking
    it: its parents), else by ``commit_moment``, ties the higher writer id first. A writer's
    clock set ahead cannot put its snapshot before one taken on top of it."""
    present = {commit.id: commit for commit in commits}
    children = Counter(parent for commit in commits for parent in set(commit.parents) if parent in present)
    rank = {writer: i for i, writer in enumerate(sorted({_writer(c) for c in commits}, reverse=True))}

    def key(commit: Commit) -> tuple[int, int, str]:
        return -commit_moment(commit), rank[_writer(commit)], commit.id

    ready = [key(commit) for commit in commits if not children[commit.id]]
    heapq.heapify(ready)
    ordered = []
    while ready:
        commit = present[heapq.heappop(ready)[2]]
        ordered.append(commit)
        for parent in set(commit.parents):
            if parent in present:
                children[parent] -= 1
                if not children[parent]:
                    heapq.heappush(ready, key(present[parent]))
    return ordered


def independent(store: Store, commits: set[str]) -> set[str]:
    """Those of ``commits`` that no other of them contains (one ``git merge-base --independent``)."""
    if len(commits) < 2:
        return set(commits)
    found = run_git(store.path, "merge-base", "--independent", *sorted(commits))
    return set(found.stdout.decode().split()) if found.returncode == 0 else set(commits)


# -- reading: every writer merged ---------------------------------------------------------
@dataclass(frozen=True)
class TagEvent:
    """A `tag --force` or `tag -d` that overruled other writers' values of a tag."""

    tag: str
    to: str | None
    over: tuple[str, ...]
    writer: str
    commit: Commit


class TeamView:
    """The store's refs with every writer's merged in (read once: one ``for-each-ref``).

    ``all_refs`` is ``store.refs("refs/")`` if the caller has it already.
    """

    def __init__(self, store: Store, all_refs: dict[str, str] | None = None) -> None:
        self.store = store
        raw = store.refs("refs/") if all_refs is None else all_refs
        # A store that never synced needs no writer id to read (and no git process to learn it).
        self.me = writer_of(store) if any(name.startswith(_TEAM_SHORT) for name in raw) else LOCAL_WRITER
        # published name -> {writer: commit}; this store's own refs under its writer id.
        self.versions: dict[str, dict[str, str]] = {}
        for name, commit in raw.items():
            if name.startswith(_TEAM_SHORT):
                writer, _, published = name[len(_TEAM_SHORT):].partition("/")
                if writer == self.me or not published:
                    continue  # our own, as last published: the local refs are newer
            else:
                writer, published = self.me, refs.published_name("refs/" + name) or ""
                if not published:
                    continue
            self.versions.setdefault(published, {})[writer] = commit
        self.writers = sorted({w for by in self.versions.values() for w in by} | {self.me})
        self._merged: dict[str, dict[str, str]] = {}
        self._times: dict[str, Commit] = {}
        self._tags: tuple[dict[str, str], dict[str, dict[str, str]]] | None = None

    @property
    def is_team(self) -> bool:
        """True when refs of another writer are here (after a sync)."""
        return self.writers != [self.me]

    def under(self, prefix: str) -> dict[str, str]:
        """``merged`` for any prefix below a merged one (``refs.IMPORTS + "ct200/"``); other
        prefixes read the store's own refs only."""
        for base in (refs.NODES, refs.PATCHES, refs.PUSHES, refs.IMPORTS, refs.DELETED_PATCHES, refs.TAGS):
            if prefix.startswith(base):
                rest = prefix[len(base):]
                return {name[len(rest):]: commit for name, commit in self.merged(base).items()
                        if name.startswith(rest)}
        short = refs.published_name(prefix)
        return {name[len(short):]: by[self.me] for name, by in self.versions.items()
                if short is not None and name.startswith(short) and self.me in by}

    def tips(self, prefix: str, name: str) -> list[str]:
        """Every writer's commit for one name (a node's branch: every writer's history)."""
        return sorted(set(self.by_writer(prefix).get(name, {}).values()))

    def by_writer(self, prefix: str) -> dict[str, dict[str, str]]:
        """``{name below prefix: {writer: commit}}`` for a local prefix such as ``refs.NODES``."""
        short = refs.published_name(prefix) or ""
        return {name[len(short):]: dict(by) for name, by in self.versions.items() if name.startswith(short)}

    def merged(self, prefix: str) -> dict[str, str]:
        """``{name: commit}`` below a local prefix, one value per name across writers.

        Nodes and push records: the newest tip (by ``commit_moment``; ties by writer). Patches: the
        version that contains every other, else the newest. Tags: see ``tags``. Imports
        and deleted patches: the union.
        """
        if prefix in self._merged:
            return self._merged[prefix]
        if prefix == refs.TAGS:
            found = self.tags()[0]
        else:
            groups = self.by_writer(prefix)
            contested = {c for by in groups.values() if len(set(by.values())) > 1 for c in by.values()}
            self._load_times(list(contested))
            # One git call for every node: a tip another tip contains is never the newest.
            tops = independent(self.store, contested) if prefix == refs.NODES else contested
            found = {}
            for name, by in groups.items():
                if prefix == refs.PATCHES:
                    found[name] = self.patch_tip(by)[0]
                else:
                    found[name] = self.newest(by, tops)
        self._merged[prefix] = found
        return found

    def newest(self, by_writer: dict[str, str], tops: set[str] | None = None) -> str:
        """The newest of several writers' commits: of those no other contains (``tops``, if
        the caller has them), the latest by ``commit_moment``, then writer id."""
        distinct = set(by_writer.values())
        if len(distinct) == 1:
            return next(iter(distinct))
        self._load_times(list(distinct))
        tops = independent(self.store, distinct) if tops is None else tops
        candidates = [(w, c) for w, c in by_writer.items() if c in tops] or list(by_writer.items())
        return max(candidates, key=lambda item: (commit_moment(self._times[item[1]]), item[0]))[1]

    def commit(self, commit: str) -> Commit:
        """One commit (read once per view)."""
        self._load_times([commit])
        return self._times[commit]

    def _load_times(self, commits: list[str]) -> None:
        wanted = sorted(set(commits) - self._times.keys())
        if wanted:
            self._times.update((c.id, c) for c in self.store.commits(wanted, no_walk=True))

    def snapshots(self, node: str | None = None, limit: int | None = None) -> list[Commit]:
        """Snapshots newest first, of one node or of all: every writer's branch of the node
        and the imports kept beside it (``refs.import_ref``). The one order of a node's
        history: ``log`` lists it, ``NODE~N`` and ``NODE@DATE`` count in it."""
        heads = self.by_writer(refs.NODES)
        if node is not None:
            revs = sorted(set(heads.get(node, {}).values()))
        else:
            revs = sorted({commit for by in heads.values() for commit in by.values()})
        revs += [commit for name, commit in sorted(self.merged(refs.IMPORTS).items())
                 if node is None or name.startswith(node + "/")]
        if self.is_team:
            return _by_ancestry(self.store.commits(revs))[:limit]
        # A run of one second may be cut by git's own limit: ask for more than shown.
        commits = self.store.commits(revs, limit=None if limit is None else limit + _TIE_MARGIN)
        if limit is not None and len(commits) == limit + _TIE_MARGIN and commits[limit - 1].time == commits[-1].time:
            commits = self.store.commits(revs)
        return _ties_by_moment(commits)[:limit]

    # -- patches --------------------------------------------------------------------------
    def patch_tip(self, versions: dict[str, str]) -> tuple[str, dict[str, str]]:
        """The current version of a patch and the writers' versions it does not contain.

        The current version is the one that contains every other (each `patch save` or
        rebase made after a sync descends from the versions it saw); when none does, the
        versions have diverged: the newest is shown, and a push refuses (``unseen``).
        """
        distinct = set(versions.values())
        if len(distinct) == 1:
            return next(iter(distinct)), {}
        self._load_times(list(distinct))
        by_time = sorted(distinct, key=lambda c: self._times[c].time, reverse=True)
        for candidate in by_time:
            if all(other == candidate or self.contains(candidate, other) for other in distinct):
                return candidate, {}
        tip = by_time[0]
        return tip, {w: c for w, c in sorted(versions.items()) if c != tip and not self.contains(tip, c)}

    def contains(self, commit: str, ancestor: str) -> bool:
        """True when ``ancestor`` is ``commit`` or in its history."""
        return run_git(self.store.path, "merge-base", "--is-ancestor", ancestor, commit).returncode == 0

    # -- tags -----------------------------------------------------------------------------
    def tags(self) -> tuple[dict[str, str], dict[str, dict[str, str]]]:
        """``(values, conflicts)``: each tag's one value, and the tags whose writers disagree.

        A tag's candidates are the distinct commits its writers' refs name. Tag events
        (``refs.TAG_MOVES``, oldest first) retire the values they overruled and revive the
        one they set; what is left is the tag (nothing left: deleted; more than one: a
        conflict ``{writer: commit}``, resolved by `tag --force`).
        """
        if self._tags is not None:
            return self._tags
        groups = self.by_writer(refs.TAGS)
        events = self.tag_events() if refs.published_name(refs.TAG_MOVES) in self.versions else []
        values: dict[str, str] = {}
        conflicts: dict[str, dict[str, str]] = {}
        for name, by in groups.items():
            retired: set[str] = set()
            for event in events:
                if event.tag == name:
                    retired.update(event.over)
                    if event.to:
                        retired.discard(event.to)
            left = {w: c for w, c in by.items() if c not in retired}
            if len(set(left.values())) == 1:
                values[name] = next(iter(left.values()))
            elif left:
                conflicts[name] = left
        self._tags = (values, conflicts)
        return self._tags

    def event_tips(self) -> dict[str, str]:
        """``{writer: newest tag event}`` (``refs.TAG_MOVES`` of each writer)."""
        return dict(self.versions.get(refs.published_name(refs.TAG_MOVES) or "", {}))

    def tag_events(self) -> list[TagEvent]:
        """Every writer's tag events, oldest first (an event after those it had seen)."""
        tips = sorted(set(self.event_tips().values()))
        found = []
        for commit in reversed(self.store.commits(tips)) if tips else []:
            meta = commit.meta
            if meta.get("kind") == "tag-move" and isinstance(meta.get("tag"), str):
                found.append(TagEvent(meta["tag"], meta.get("to"), tuple(meta.get("over") or ()),
                                      str(meta.get("writer", "?")), commit))
        return found

    def tag_writers(self, name: str) -> dict[str, str]:
        """``{writer: commit}`` of every writer holding tag ``name``."""
        return dict(self.versions.get(f"tags/{name}", {}))


def tag_conflict_error(name: str, values: dict[str, str]) -> RefError:
    """The error a command reading a conflicting tag ends with (exit 2: an ambiguous ref)."""
    shown = " and ".join(f"{commit[:10]} ({writer})" for writer, commit in sorted(values.items()))
    return RefError(f"tag {name!r} names {len(set(values.values()))} snapshots: {shown}",
                    hint=f"pick one for the team: `snapver tag --force {name} REF`, then `snapver sync`")


# -- sync ---------------------------------------------------------------------------------
@dataclass
class SyncResult:
    """What one `sync` did."""

    remote: str
    writer: str
    fetched: list[str] = field(default_factory=list)  # writers whose refs changed here
    pushed: int = 0  # refs of ours published (created or moved)
    deleted: int = 0  # refs of ours removed from the remote (deleted here)
    writers: list[str] = field(default_factory=list)  # every writer now known here
    tag_conflicts: dict[str, dict[str, str]] = field(default_factory=dict)
    diverged_patches: dict[str, dict[str, str]] = field(default_factory=dict)
    reclaimed: list[str] = field(default_factory=list)  # refs under our id another store had published
    # Other writers' newest snapshots and records dated ahead of this machine's clock.
    future: list[dict[str, Any]] = field(default_factory=list)
    tag_moves: list[dict[str, Any]] = field(default_factory=list)  # team tags another writer moved

    @property
    def unchanged(self) -> bool:
        return not (self.fetched or self.pushed or self.deleted)

    def to_json(self) -> dict[str, Any]:
        return {"remote": self.remote, "writer": self.writer, "fetched": self.fetched, "pushed": self.pushed,
                "deleted": self.deleted, "writers": self.writers, "unchanged": self.unchanged,
                "tag_conflicts": self.tag_conflicts, "diverged_patches": self.diverged_patches,
                "reclaimed": self.reclaimed, "future": self.future, "tag_moves": self.tag_moves}


def git_error(stderr: bytes, fallback: str) -> str:
    """What git said went wrong talking to a remote: its first ``fatal:``/``error:`` line (the
    ones after it are advice), else its last line."""
    for line in stderr.decode("utf-8", "replace").splitlines():
        for prefix in ("fatal: ", "error: ", "ERROR: "):
            if line.startswith(prefix) and line[len(prefix):].strip():
                return line[len(prefix):].strip()
    return last_line(stderr, fallback)


def _git_remote(store: Store, remote: str, timeout: float | None, *args: str) -> Any:
    """Run a git command that talks to the remote; a timeout is the remote's failure (exit 3)."""
    limit = git_timeout() if timeout is None else timeout
    env = {**GIT_ENV, **_bounded_ssh(store, limit)} if _over_ssh(remote) else GIT_ENV
    try:
        return run_git(store.path, *args, timeout=limit, env=env)
    except GitTimeoutError as exc:
        raise RemoteError(f"the remote {remote} did not answer `git {args[0]}` in time",
                          hint="check the network and the remote's address; nothing changed here") from exc


def _over_ssh(remote: str) -> bool:
    """Whether git reaches ``remote`` with ssh (``ssh://`` or scp-like ``host:path``)."""
    return remote.startswith(("ssh://", "git+ssh://", "ssh+git://")) or (
        "://" not in remote and re.match(r"^[^/:]+:", remote) is not None)


def _bounded_ssh(store: Store, limit: float) -> dict[str, str]:
    """GIT_SSH_COMMAND for a git that talks to the remote: the user's ssh command (their
    GIT_SSH_COMMAND, else core.sshCommand, else ``ssh``) with connect and keepalive timeouts
    after their own options; ssh keeps an option's first value, so any they set wins. A
    remote that accepts TCP and never answers, or goes silent, then ends ssh itself.
    Nothing when they use GIT_SSH (a program that may take no options) or a program that
    is not ``ssh``."""
    if os.environ.get("GIT_SSH") and not os.environ.get("GIT_SSH_COMMAND"):
        return {}
    command = os.environ.get("GIT_SSH_COMMAND") or _config_get(store, "core.sshCommand") or "ssh"
    try:
        program = shlex.split(command)[0]
    except (ValueError, IndexError):
        return {}
    if os.path.basename(program) != "ssh":
        return {}
    seconds = max(1, math.ceil(min(SSH_CONNECT_TIMEOUT, limit)))
    return {"GIT_SSH_COMMAND": f"{command} -o ConnectTimeout={seconds} -o ServerAliveInterval={seconds} "
                               f"-o ServerAliveCountMax={SSH_ALIVE_MISSES}"}


def ls_remote(store: Store, remote: str, timeout: float | None = None) -> dict[str, str]:
    """``{ref: oid}`` of every ref on the remote (RemoteError, exit 3, when unreachable)."""
    result = _git_remote(store, remote, timeout, "ls-remote", "--", remote)
    if result.returncode != 0:
        raise RemoteError(f"cannot reach the remote {remote}: {git_error(result.stderr, 'git ls-remote failed')}",
                          hint="check [store] remote, the network and your git/SSH credentials; nothing changed")
    found = {}
    for line in result.stdout.decode("utf-8", "replace").splitlines():
        oid, _, name = line.partition("\t")
        if name and not name.endswith("^{}"):
            found[name] = oid
    return found


def remote_versions_unseen(store: Store, remote: str, name: str, tip: str,
                           timeout: float | None = None) -> dict[str, str]:
    """``{writer: commit}`` of the remote's versions of patch ``name`` that ``tip`` does not
    contain (not fetched yet, or edited apart): the lease a push checks before writing."""
    me = writer_of(store)
    found = {}
    view = TeamView(store)
    for ref, oid in ls_remote(store, remote, timeout).items():
        writer, _, rest = ref[len(refs.REMOTE_SPACE):].partition("/")
        if not ref.startswith(refs.REMOTE_SPACE) or rest != f"patches/{name}" or writer == me or oid == tip:
            continue
        if oid not in store.existing([oid]) or not view.contains(tip, oid):
            found[writer] = oid
    return found


def sync(store: Store, remote: str, timeout: float | None = None, lock_wait: float | None = None,
         reclaim: bool = False) -> SyncResult:
    """Fetch every writer's refs from ``remote``, then publish ours (see the module's text).

    RemoteError (exit 3) for a remote that cannot be reached, refuses the push, or holds
    something that is not a snapver store, or refs under our writer id this store did not
    publish (``reclaim``: replace or delete them with ours); StoreLockedError (exit 4) while
    another command writes this store. Whatever fails, no local ref but the mirror of the
    remote moves, and the next sync completes the work.
    """
    with store.lock(wait=lock_wait):
        remove_dead_writers_packs(store.path / "objects" / "pack")  # what a killed or failed fetch left
        settings = _config_all(store)
        if WRITER_KEY in settings:
            store._team_writer = settings[WRITER_KEY]  # type: ignore[attr-defined]
        else:
            set_writer(store, default_writer())
        me = writer_of(store)
        result = SyncResult(remote, me)
        listing = ls_remote(store, remote, timeout)
        ours = {name for name in listing if name.startswith(refs.REMOTE_SPACE)}
        foreign = sorted(name for name in listing if name != "HEAD" and name not in ours)
        if foreign and not ours:
            raise RemoteError(f"the remote {remote} is not a snapver store: it holds {foreign[0]}"
                              + (f" and {len(foreign) - 1} other ref(s)" if len(foreign) > 1 else ""),
                              hint="point [store] remote at an empty repository made for snapver "
                                   "(git init --bare), or one that other snapver stores sync with")
        remote_refs = {name[len(refs.REMOTE_SPACE):]: oid for name, oid in listing.items() if name in ours}
        synced = settings.get(SYNCED_KEY) == "true"
        mine_there = {name[len(me) + 1:]: oid for name, oid in remote_refs.items() if name.startswith(me + "/")}
        all_refs = store.refs("refs/")
        mirror = {name[len(_TEAM_SHORT):]: commit for name, commit in all_refs.items() if name.startswith(_TEAM_SHORT)}
        own = {}
        for name, commit in all_refs.items():
            published = refs.published_name("refs/" + name)
            if published is not None:
                own[published] = commit
        strangers = _not_published_here(store, me, mine_there, own, mirror)
        if strangers and not reclaim:
            raise _strangers_error(me, remote, strangers)
        synced = synced or bool(mine_there)  # what is there under our id is ours now
        refused = None
        if mirror != remote_refs:
            changed = {name.split("/", 1)[0] for name in set(mirror) ^ set(remote_refs)}
            changed |= {name.split("/", 1)[0] for name in set(mirror) & set(remote_refs)
                        if mirror[name] != remote_refs[name]}
            tags_before = TeamView(store, all_refs).tags()[0] if _moves_tags(mirror, remote_refs) else None
            refused = _fetch(store, remote, timeout)
            result.fetched = sorted(changed - {me})
            if tags_before is not None:
                result.tag_moves = _tag_moves(store, me, tags_before, mirror, remote_refs)
        updates = {name: commit for name, commit in own.items() if mine_there.get(name) != commit}
        _check_forward(store, remote, me, updates, {n: c for n, c in mine_there.items() if n not in strangers})
        # Only tags and patch names are ever deleted here (and what a reclaim takes back); a
        # snapshot branch, a ledger or the tag events missing here were not written here.
        deletions = sorted(name for name in mine_there if name not in own and (
            name in strangers or (synced and name.startswith(("tags/", "patches/")))))
        if updates or deletions:
            _publish(store, remote, timeout, me, updates, deletions, mine_there)
            result.pushed, result.deleted = len(updates), len(deletions)
        result.reclaimed = sorted(strangers)
        if not synced:
            store.git("config", SYNCED_KEY, "true")
        view = TeamView(store, None if result.fetched or mirror != remote_refs or updates or deletions else all_refs)
        result.writers = view.writers
        result.future = future_dated(view)
        result.tag_conflicts = view.tags()[1]
        for name, versions in view.by_writer(refs.PATCHES).items():
            unseen = view.patch_tip(versions)[1]
            if unseen:
                result.diverged_patches[name] = versions
        if refused is not None:
            raise refused
        return result


def _fetch(store: Store, remote: str, timeout: float | None) -> RemoteError | None:
    """Fetch every writer's refs into ``refs.INCOMING``, then into the mirror those ``_admit``
    accepts; returns the error naming a writer it refused. A fetch that fails removes the temporary
    files it began (a ``tmp_pack_*``, or a ``tmp_obj_*`` when git unpacked the objects): on
    a full disk they would keep it full, and the next sync would fail the same way."""
    objects = store.path / "objects"
    before = _git_temps(objects)
    fetched = _git_remote(store, remote, timeout, "fetch", "--prune", "--no-tags", "--no-write-fetch-head",
                          "--quiet", remote, f"+{refs.REMOTE_SPACE}*:{refs.INCOMING}*")
    if fetched.returncode == 0:
        try:
            return _admit(store, remote)
        finally:
            _drop_incoming(store)
    _drop_incoming(store)
    left = _git_temps(objects) - before
    remove_dead_writers_packs(objects / "pack", settled=0, only={path.name for path in left})
    for path in left:
        if path.parent.name != "pack":
            path.unlink(missing_ok=True)  # git's loose-object temporary: its writer, the fetch, has ended
    reason = git_error(fetched.stderr, "git fetch failed")
    if "No space left on device" in fetched.stderr.decode("utf-8", "replace"):
        raise StoreError(f"cannot fetch from the remote {remote}: the store's disk is full ({reason})",
                         hint="make room for the store, then `snapver sync`; nothing changed here")
    raise RemoteError(f"cannot fetch from the remote {remote}: {reason}",
                      hint="nothing changed here; run `snapver sync` again")


def _admit(store: Store, remote: str) -> RemoteError | None:
    """Move each writer's mirror to the refs just fetched into ``refs.INCOMING``, once every
    commit new here with a manifest (a snapshot, a patch, a push record) has a tree that is
    exactly its manifest: what `fsck` checks, checked before anything here can name it. A
    writer with one that is not is refused whole (none of its refs move); the others move in
    one ``update-ref`` transaction. Returns the error (exit 3) naming the refused writer: the
    sync still publishes ours (one writer's damage must not stop the team), then raises it."""
    incoming, mirror = _ref_values(store, refs.INCOMING), _ref_values(store, refs.TEAM)
    writers = sorted({name.split("/", 1)[0] for name in [*incoming, *mirror]})
    checked: dict[str, list[str]] = {}  # commit -> its disagreements, once across writers
    moves: list[str] = []
    refused: list[tuple[str, str, str]] = []
    for writer in writers:
        fetched = {name: oid for name, oid in incoming.items() if name.split("/", 1)[0] == writer}
        seen = {name: oid for name, oid in mirror.items() if name.split("/", 1)[0] == writer}
        if fetched == seen:
            continue
        bad = _first_disagreement(store, sorted(set(fetched.values()) - set(seen.values())), checked)
        if bad is not None:
            refused.append((writer, *bad))
            continue
        moves += [f"update {refs.TEAM}{name} {oid} {seen.get(name, ZERO_OID)}\n"
                  for name, oid in sorted(fetched.items()) if seen.get(name) != oid]
        moves += [f"delete {refs.TEAM}{name} {oid}\n" for name, oid in sorted(seen.items()) if name not in fetched]
    if moves:
        store.git("update-ref", "--stdin", input="".join(moves).encode())
    if not refused:
        return None
    writer, commit, problem = refused[0]
    others = f"; and {len(refused) - 1} other writer(s)" if len(refused) > 1 else ""
    return RemoteError(f"refusing what {writer!r} publishes on {remote}: commit {commit[:10]}'s manifest and "
                       f"tree disagree ({problem}){others}",
                       hint="nothing of that writer's was taken; the rest was synced. Ask them to run "
                            "`snapver fsck`, then sync again")


def _first_disagreement(store: Store, tips: list[str], checked: dict[str, list[str]]) -> tuple[str, str] | None:
    """``(commit, why)`` of the first commit reachable from ``tips`` and from no ref of this
    store (but those being fetched) whose manifest and tree disagree; None if there is none."""
    if not tips:
        return None
    for commit in store.commits([*tips, "--not", f"--exclude={refs.REMOTE_SPACE}*", "--all"]):
        if commit.meta.get("kind") not in MANIFEST_KINDS:
            continue
        if commit.id not in checked:
            try:
                checked[commit.id] = tree_disagreements(store.ls_tree(commit.id), store.manifest(commit.id))
            except GitTimeoutError:
                raise
            except StoreError as exc:
                checked[commit.id] = [exc.message]
        if checked[commit.id]:
            return commit.id, checked[commit.id][0]
    return None


def _ref_values(store: Store, prefix: str) -> dict[str, str]:
    """``{name below prefix: object}`` as the refs hold them (a tag object not peeled: the
    value an ``update-ref`` checks)."""
    out = store.git("for-each-ref", "--format=%(objectname) %(refname)", prefix)
    rows = (line.split(" ", 1) for line in out.decode("utf-8", "surrogateescape").splitlines() if line)
    return {name[len(prefix):]: oid for oid, name in rows}


def _drop_incoming(store: Store) -> None:
    """Delete every ``refs.INCOMING`` ref: what was refused is then reachable from nothing."""
    left = _ref_values(store, refs.INCOMING)
    if left:
        store.git("update-ref", "--stdin",
                  input="".join(f"delete {refs.INCOMING}{name} {oid}\n" for name, oid in left.items()).encode())


def _git_temps(objects: Path) -> set[Path]:
    """git's temporary files in the object store: packs being received, loose objects being written."""
    found: set[Path] = set()
    for folder in objects.iterdir() if objects.is_dir() else ():
        if folder.name == "pack" or (len(folder.name) == 2 and folder.is_dir()):
            found.update(path for path in folder.iterdir()
                         if path.name.startswith(GIT_TEMP_PREFIXES) or path.name.startswith("tmp_obj_"))
    return found


def _moves_tags(mirror: dict[str, str], remote_refs: dict[str, str]) -> bool:
    """True when a fetch would change a writer's tag or tag events here."""
    return any(mirror.get(name) != remote_refs.get(name) for name in set(mirror) | set(remote_refs)
               if name.split("/", 1)[-1].startswith(("tags/", "tag-moves")))


def _tag_moves(store: Store, me: str, before: dict[str, str], mirror: dict[str, str],
               remote_refs: dict[str, str]) -> list[dict[str, Any]]:
    """The team tags another writer moved, as fetched just now: ``{tag, old, new, by}``.
    ``by``: the writers whose fetched tag ref, or a tag event along their own line of events
    (its namespace: never a field of the event), set the new value."""
    view = TeamView(store)
    after = view.tags()[0]
    moves = []
    for name, new in sorted(after.items()):
        old = before.get(name)
        if old is None or old == new:
            continue
        by = {writer for writer, commit in view.tag_writers(name).items() if writer != me and commit == new
              and mirror.get(f"{writer}/tags/{name}") != commit}
        for writer in {ref.split("/", 1)[0] for ref in remote_refs} - {me} - by:
            tip, seen = remote_refs.get(f"{writer}/tag-moves"), mirror.get(f"{writer}/tag-moves")
            if tip and tip != seen and _sets_in_line(store, tip, seen, name, new):
                by.add(writer)
        moves.append({"tag": name, "old": old, "new": new, "by": sorted(by)})
    return moves


def _sets_in_line(store: Store, tip: str, seen: str | None, tag: str, value: str) -> bool:
    """True when an event on the first-parent line from ``tip`` back to ``seen`` sets ``tag`` to ``value``."""
    for event in store.commits([tip] + ([f"^{seen}"] if seen else []), first_parent=True):
        if event.meta.get("kind") == "tag-move" and event.meta.get("tag") == tag:
            return event.meta.get("to") == value
    return False


def future_dated(view: TeamView, now: float | None = None) -> list[dict[str, Any]]:
    """Other writers' snapshot branches and push ledgers whose newest commit is dated more
    than ``FUTURE_MARGIN`` ahead of this machine's clock (that writer's clock is wrong).
    Such a time orders nothing that ancestry orders (``_by_ancestry``); it is said, not trusted."""
    tips = {(writer, f"{prefix}{name}"): commit for prefix in ("nodes/", "pushes/")
            for name, by in view.by_writer(refs.local_name(prefix)).items()
            for writer, commit in by.items() if writer != view.me}
    view._load_times(list(set(tips.values())))
    now = time.time() if now is None else now
    found = []
    for (writer, ref), commit in sorted(tips.items()):
        ahead = commit_moment(view.commit(commit)) / 1e9 - now
        if ahead > FUTURE_MARGIN:
            found.append({"writer": writer, "ref": ref, "commit": commit, "ahead_seconds": round(ahead),
                          "time": view.commit(commit).time.isoformat()})
    return found


def _not_published_here(store: Store, me: str, mine_there: dict[str, str], own: dict[str, str],
                        mirror: dict[str, str]) -> dict[str, str]:
    """``{name: commit}`` of the refs under our writer id on the remote that this store did
    not publish. Ours are what the mirror says we published or saw there, and any commit this
    store's own refs contain (a first publish whose sync was killed before it could note it:
    its `git push` went on alone). Anything else another store published under our id."""
    unknown = {name: oid for name, oid in mine_there.items()
               if mirror.get(f"{me}/{name}") != oid and own.get(name) != oid}
    return {name: oid for name, oid in sorted(unknown.items()) if not _in_own_history(store, oid)}


def _in_own_history(store: Store, commit: str) -> bool:
    """True when one of this store's own branches or tags contains ``commit`` (never a mirror's)."""
    if not re.fullmatch(r"[0-9a-f]{40}", commit):
        return False
    found = run_git(store.path, "for-each-ref", "--count=1", "--format=%(refname)", f"--contains={commit}",
                    "refs/heads/", "refs/tags/")
    return found.returncode == 0 and bool(found.stdout.strip())


def _strangers_error(me: str, remote: str, strangers: dict[str, str]) -> RemoteError:
    names = ", ".join(repr(name) for name in list(strangers)[:3]) + (" …" if len(strangers) > 3 else "")
    return RemoteError(f"the writer id {me!r} already publishes to {remote} from another store: "
                       f"{len(strangers)} ref(s) there this store did not publish ({names}); nothing was sent",
                       hint="if that store is another engineer's, give this one its own writer id "
                            "(`snapver init --writer NAME`); if it is gone and the id is yours, "
                            "`snapver sync --reclaim` replaces them with this store's")


# What only ever moves forward in a writer's namespace: a snapshot branch, a push ledger,
# the tag events (a patch may be deleted and made anew; a tag moves anywhere).
_FORWARD_ONLY = ("nodes/", "pushes/", "tag-moves")


def _check_forward(store: Store, remote: str, me: str, updates: dict[str, str], remote_values: dict[str, str]) -> None:
    """Refuse to publish a snapshot branch, ledger or event log that does not contain what the
    remote holds for it: another store publishes under this writer id (its work would be lost)."""
    for name, commit in sorted(updates.items()):
        old = remote_values.get(name)
        if old is None or not name.startswith(_FORWARD_ONLY):
            continue
        if run_git(store.path, "merge-base", "--is-ancestor", old, commit).returncode != 0:
            raise RemoteError(f"not publishing {name}: the remote's {old[:10]} (writer {me}) is not in this "
                              "store's history, so another store publishes under the same writer id",
                              hint="give this store its own writer id: `snapver init --writer NAME`, then sync")


def _publish(store: Store, remote: str, timeout: float | None, me: str, updates: dict[str, str],
             deletions: list[str], remote_values: dict[str, str]) -> None:
    """One atomic push of our refs into our namespace, each leased at its value seen on the remote."""
    space = f"{refs.REMOTE_SPACE}{me}/"
    args = ["push", "--atomic", "--porcelain", "--no-verify", "--quiet"]
    specs = []
    for name, commit in sorted(updates.items()):
        args.append(f"--force-with-lease={space}{name}:{remote_values.get(name, '')}")
        specs.append(f"{commit}:{space}{name}")
    for name in deletions:
        args.append(f"--force-with-lease={space}{name}:{remote_values[name]}")
        specs.append(f":{space}{name}")
    pushed = _git_remote(store, remote, timeout, *args, remote, *specs)
    if pushed.returncode != 0:
        rejected = [line for line in pushed.stdout.decode("utf-8", "replace").splitlines() if line.startswith("!")]
        reason = rejected[0].split("\t")[-1] if rejected else git_error(pushed.stderr, "git push failed")
        where = rejected[0].split("\t")[1].split(":")[-1] if rejected and "\t" in rejected[0] else ""
        raise RemoteError(f"the remote {remote} refused the push{' of ' + where if where else ''}: {reason}",
                          hint="nothing was published and nothing changed here; "
                               "`snapver sync` again (another store with this writer id? then `init --writer`)")
    # Our namespace's mirror now holds what we published (the next sync's lease).
    lines = "".join(f"update {refs.TEAM}{me}/{name} {commit}\n" for name, commit in updates.items())
    lines += "".join(f"delete {refs.TEAM}{me}/{name}\n" for name in deletions)
    store.git("update-ref", "--stdin", input=lines.encode())
