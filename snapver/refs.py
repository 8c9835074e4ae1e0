"""The ref grammar (SPEC "Refs"): text → the snapshot, patch or live node it names.

Forms, in the order they are tried::

    NODE@live                 the live node (anywhere)
    NODE@latest               the node's newest snapshot
    NODE@TAG                  the tag's snapshot if it is NODE's (it beats a date of that spelling);
                              another node's tag not spelled as a date: NODE's newest snapshot
                              taken at or before the tag's snapshot
    NODE@DATE                 its newest snapshot taken on or before DATE (local time)
    REF~N                     N snapshots before REF: in its node's history as ``log NODE`` lists
                              it (imports included), else first parents; ``REF~`` is ``REF~1``
    tags/NAME  patches/NAME  refs/...   a tag, a patch or any ref, named explicitly
    NAME                      a node, a tag or a patch; more than one of them is ambiguous
    DATE                      (naming nothing else) the snapshot taken that day, if one node has one
    HEX (4 to 40 digits)      (naming nothing else) a snapshot or patch commit, as git abbreviates
    ./dir  /dir  ~/dir  a/b   an existing folder: a live local tree (see ``folders.resolve_folder``)

DATE is ISO (``2026-05-22``, or ``2026-05-22T14:30`` after ``@``) or spoken (``may22``,
``may-22``, ``May 22``: the latest such day that is not in the future). A bare node
name is the live node where a live tree fits (diff, status, patch capture) and its
newest snapshot where only a snapshot does (tag, show, log, ``--base``, ``--to``).
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta, timezone

from snapver.config import NO_CONFIG_HINT, Config
from snapver.errors import RefError, StoreError
from snapver.folders import FolderTree, is_folder_text, resolve_folder
from snapver.store import refs as store_refs
from snapver.store.repo import Commit, Store
from snapver.store.team import TeamView, tag_conflict_error

_HEX = re.compile(r"^[0-9a-fA-F]{4,40}$")  # git's shortest abbreviation: 4
_TILDE = re.compile(r"^(?P<base>.+?)~(?P<n>\d*)$")
_ISO_DAY = re.compile(r"^(?P<y>\d{4})-(?P<m>\d{1,2})-(?P<d>\d{1,2})$")
_SPOKEN_DAY = re.compile(r"^(?P<month>[a-zA-Z]{3,9})[-_ ]?(?P<d>\d{1,2})$")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august",
           "september", "october", "november", "december")
_QUALIFIERS = {"tags/": store_refs.TAGS, "patches/": store_refs.PATCHES}
DATE_HINT = "a date is 2026-05-22, may22 or may-22"


@dataclass(frozen=True)
class TreeRef:
    """What a ref names where a live tree fits: a live node, or a commit (snapshot or patch)."""

    text: str
    live_node: str | None = None
    commit: str | None = None
    folder: FolderTree | None = None  # a local folder read as a live tree

    @property
    def is_live(self) -> bool:
        return self.live_node is not None or self.folder is not None


def resolve_snapshot(store: Store | None, config: Config, text: str) -> str:
    """The commit id a ref names where only a snapshot (or patch) fits."""
    return Resolver(store, config).snapshot(text)


def resolve_tree(store: Store | None, config: Config, text: str, root: str | None = None) -> TreeRef:
    """What a ref names where a live node fits too (diff, status, patch capture); a folder
    ref's ``TreeRef.folder`` is read with ``ops.diff.open_live`` (``root``: ``--root``)."""
    return Resolver(store, config, folder_root=root).tree(text)


def parse_day(text: str, today: date | None = None) -> date | None:
    """The day ``text`` names (ISO or spoken, e.g. ``may22``), or None if it is not a date.

    A spoken day without a year is the latest such day that is not after ``today``.
    """
    today = today or date.today()
    iso = _ISO_DAY.match(text)
    if iso:
        try:
            return date(int(iso["y"]), int(iso["m"]), int(iso["d"]))
        except ValueError:
            return None
    spoken = _SPOKEN_DAY.match(text)
    if not spoken:
        return None
    word = spoken["month"].lower()
    months = [index for index, name in enumerate(_MONTHS, 1) if name.startswith(word)]
    if len(months) != 1:
        return None
    for year in (today.year, today.year - 1, today.year - 2, today.year - 3, today.year - 4):
        try:
            day = date(year, months[0], int(spoken["d"]))
        except ValueError:
            continue  # e.g. feb29 outside a leap year: try earlier years
        if day <= today:
            return day
    return None


def local_day(commit: Commit) -> date:
    """The day (in this machine's local time) a snapshot was taken."""
    return commit.time.astimezone().date()


class Resolver:
    """Resolves refs against one store and config; reads the store's refs once (one git call)."""

    def __init__(self, store: Store | None, config: Config, folder_root: str | None = None) -> None:
        self.store = store
        self.config = config
        self.folder_root = folder_root  # `--root PREFIX`: where a folder ref's root sits
        self._view: TeamView | None = None

    # -- the two entry points ---------------------------------------------------------
    def tree(self, text: str) -> TreeRef:
        self._check_text(text)
        if is_folder_text(text):
            return TreeRef(text, folder=resolve_folder(text, self.config, self.store, self.folder_root))
        node, at = self._split_at(text)
        if at is not None and at.lower() == "live":
            return TreeRef(text, live_node=self._live_node(node, text))
        if at is None and not _TILDE.match(text):
            found = self._names(text)
            if len(found) == 1 and found[0][0] == "node":
                node = found[0][1]
                if node not in self.config.nodes:
                    raise RefError(f"node {node!r} is not in the config, so its live tree cannot be read",
                                   hint=f"say {node}@latest for its newest snapshot")
                return TreeRef(text, live_node=node)
        return TreeRef(text, commit=self.snapshot(text))

    def snapshot(self, text: str) -> str:
        self._check_text(text)
        if is_folder_text(text):
            raise RefError(f"{text!r} is a folder (a live tree); only a snapshot fits here",
                           hint=f"record it first: snapver import {text} --node NAME --date YYYY-MM-DD")
        tilde = _TILDE.match(text)
        if tilde:
            return self._back(tilde["base"], int(tilde["n"] or 1), text)
        node, at = self._split_at(text)
        if at is not None:
            return self._at(node, at, text)
        for prefix, ref_prefix in _QUALIFIERS.items():
            if text.startswith(prefix):
                return self._qualified(ref_prefix + text[len(prefix):], text)
        if text.startswith("refs/"):
            return self._qualified(text, text)
        found = self._names(text)
        if len(found) > 1:
            raise RefError(f"ambiguous ref {text!r}: it names " + " and ".join(f"{k} {text}" for k, _ in found),
                           hint="say " + " or ".join(self._qualified_forms(text, found)))
        if found:
            kind, value = found[0]
            return self._newest(value) if kind == "node" else value
        day = parse_day(text)
        # `feb1`, `dec12` are hex too: a date and a commit id prefix both count.
        commits = self._hex_commits(text.lower()) if _HEX.match(text) else []
        if day is not None:
            return self._on_day(day, text, commits)
        if len(commits) > 1:
            raise RefError(f"ambiguous ref {text!r}: {len(commits)} commits start with it",
                           hint="say one of " + ", ".join(c[:12] for c in commits))
        if commits:
            return commits[0]
        raise self._unknown(text)

    # -- forms ------------------------------------------------------------------------
    def _check_text(self, text: str) -> None:
        if not text or not text.strip():
            raise RefError("empty ref", hint="name a node, a tag, a date, a patch or a snapshot id")
        if text.startswith("-"):
            raise RefError(f"invalid ref {text!r}: a ref cannot start with '-'",
                           hint="to diff paths, put them after `--`")
        if any(ord(ch) < 32 for ch in text):
            raise RefError(f"invalid ref {text!r}: control characters are not allowed")

    @staticmethod
    def _split_at(text: str) -> tuple[str, str | None]:
        if "@" not in text or _TILDE.match(text):
            return text, None
        node, _, at = text.rpartition("@")
        return node, at

    def _team(self) -> TeamView | None:
        """Every writer's refs merged (store/team.py), read once (one git call)."""
        if self._view is None and self.store is not None:
            self._view = TeamView(self.store)
        return self._view

    def _refs_under(self, prefix: str) -> dict[str, str]:
        """``{name: commit}`` below ``prefix``, one value per name across the team's writers."""
        view = self._team()
        return view.under(prefix) if view is not None else {}

    def _tag(self, name: str) -> str | None:
        """The team's value of tag ``name``; a tag whose writers disagree is an error naming both."""
        view = self._team()
        if view is None:
            return None
        values, conflicts = view.tags()
        if name in conflicts:
            raise tag_conflict_error(name, conflicts[name])
        return values.get(name)

    def _heads_map(self) -> dict[str, str]:
        return self._refs_under(store_refs.NODES)

    def _known_nodes(self) -> list[str]:
        return sorted(set(self.config.nodes) | set(self._heads_map()))

    def _require_store(self, text: str) -> Store:
        if self.store is None:
            raise RefError(f"{text!r} names a snapshot, but there is no store yet",
                           hint="run `snapver pull` first")
        return self.store

    def _live_node(self, node: str, text: str) -> str:
        if node in self.config.nodes:
            return node
        if node in self._heads_map():
            raise RefError(f"{text!r}: node {node!r} is not in the config, so its live tree cannot be read")
        raise RefError(f"unknown node {node!r} in {text!r}",
                       hint=f"known nodes: {', '.join(self._known_nodes()) or '(none)'}")

    def _at(self, node: str, at: str, text: str) -> str:
        if at.lower() == "live":
            raise RefError(f"{text!r} is a live tree; only a snapshot fits here",
                           hint=f"say {node}@latest for its newest snapshot, or `snapver pull {node}` first")
        if node not in self._known_nodes():
            raise RefError(f"unknown node {node!r} in {text!r}",
                           hint=f"known nodes: {', '.join(self._known_nodes()) or '(none)'}")
        if at.lower() == "latest":
            return self._newest(node)
        tagged = self._tag(at)
        if tagged is not None and self._is_nodes(node, tagged, text):
            return tagged  # a tag of the node's beats a date of the same spelling
        limit = _parse_moment(at)
        if limit is None:
            if tagged is not None:  # another node's tag, not a date: what the node ran then
                return self._at_tag(node, at, tagged, text)
            raise RefError(f"unknown ref {text!r}: after '@' comes live, latest or a date",
                           hint=DATE_HINT)
        for commit in self._history(node):
            if commit.time <= limit:
                return commit.id
        raise RefError(f"{text!r}: node {node!r} has no snapshot from {at} or before",
                       hint=self._history_hint(node))

    def _is_nodes(self, node: str, commit_id: str, text: str) -> bool:
        """True when ``commit_id`` is one of ``node``'s snapshots."""
        if self._require_store(text).commit(commit_id).meta.get("node") == node:
            return True
        return any(commit.id == commit_id for commit in self._history(node))

    def _at_tag(self, node: str, tag: str, tagged: str, text: str) -> str:
        """``NODE@TAG`` for a tag of another node's snapshot (spelled other than a date): the
        node's newest snapshot taken at or before it (what the node ran when the tag was taken)."""
        history = self._history(node)
        tag_commit = self._require_store(text).commit(tagged)
        for commit in history:
            if commit.time <= tag_commit.time:
                return commit.id
        raise RefError(f"{text!r}: node {node!r} has no snapshot from before tag {tag!r} "
                       f"({tag_commit.time.astimezone():%Y-%m-%d %H:%M})", hint=self._history_hint(node))

    def _back(self, base: str, steps: int, text: str) -> str:
        start = self.snapshot(base)
        store = self._require_store(text)
        # A node's snapshot counts back in its history as `log NODE` lists it: an import
        # older than the head sits beside the branch, off its first parents.
        node = store.commit(start).meta.get("node")
        if isinstance(node, str) and node in self._heads_map():
            history = [commit.id for commit in self._history(node)]
            if start in history:
                index = history.index(start)
                if index + steps >= len(history):
                    raise RefError(f"{text!r}: {base} has only {len(history) - 1 - index} snapshot(s) before it",
                                   hint=f"`snapver log {node}` lists them")
                return history[index + steps]
        # Anything else (a patch: its first parent is its base) by first parents.
        chain = store.git("rev-list", "--first-parent", f"-n{steps + 1}", start).split()
        if len(chain) <= steps:
            raise RefError(f"{text!r}: {base} has only {len(chain) - 1} snapshot(s) before it")
        return chain[steps].decode()

    def _qualified(self, full_ref: str, text: str) -> str:
        name = full_ref.split("/", 2)[-1] if not text.startswith("refs/") else full_ref
        if text.startswith(tuple(_QUALIFIERS)):  # a team-wide name
            self._require_store(text)
            qualifier = text[:text.index("/") + 1]
            kind_prefix, short = _QUALIFIERS[qualifier], text[len(qualifier):]
            commit = self._tag(short) if kind_prefix == store_refs.TAGS else self._refs_under(kind_prefix).get(short)
            if commit is None:
                raise self._unknown(text)
            return commit
        commit = self._require_store(text).ref(full_ref) if store_refs.valid_ref_name(name) else None
        if commit is None:
            raise self._unknown(text)
        return commit

    def _names(self, text: str) -> list[tuple[str, str]]:
        """Every name ``text`` matches: ("node", name), ("tag", commit), ("patch", commit)."""
        found: list[tuple[str, str]] = []
        if text in self.config.nodes or text in self._heads_map():
            found.append(("node", text))
        tagged = self._tag(text)
        if tagged:
            found.append(("tag", tagged))
        patch = self._refs_under(store_refs.PATCHES).get(text)
        if patch:
            found.append(("patch", patch))
        return found

    @staticmethod
    def _qualified_forms(text: str, found: list[tuple[str, str]]) -> list[str]:
        forms = {"node": f"{text}@live (the live node) or {text}@latest (its newest snapshot)",
                 "tag": f"tags/{text} (the tag)", "patch": f"patches/{text} (the patch)"}
        return [forms[kind] for kind, _ in found]

    def _newest(self, node: str) -> str:
        self._require_store(f"{node}@latest")
        head = self._heads_map().get(node)
        if head is None:
            raise RefError(f"node {node!r} has no snapshot yet", hint=f"run `snapver pull {node}`")
        return head

    def _history(self, node: str) -> list[Commit]:
        """The node's snapshots newest first, as ``log NODE`` lists them (imports included)."""
        self._newest(node)  # no store or no snapshot yet: say so
        view = self._team()
        return view.snapshots(node) if view is not None else []

    def _history_hint(self, node: str) -> str:
        days = sorted({local_day(c).isoformat() for c in self._history(node)})
        return f"{node} has snapshots from {', '.join(days[:3])}" + (" …" if len(days) > 3 else "")

    def _on_day(self, day: date, text: str, commits: list[str]) -> str:
        """The snapshot taken on ``day``, when one node has one; ``commits``: those whose id
        starts with ``text`` (a date spelled in hex digits), which count as meanings too."""
        self._require_store(text)
        chosen: dict[str, str] = {}
        for node in sorted(self._heads_map()):
            for commit in self._history(node):
                if local_day(commit) == day:
                    chosen[node] = commit.id  # newest first: keep the first seen
                    break
        by_id = [commit for commit in commits if commit not in chosen.values()]
        if len(chosen) + len(by_id) == 1:
            return next(iter(chosen.values())) if chosen else by_id[0]
        if chosen and not by_id:
            raise RefError(f"ambiguous ref {text!r}: {len(chosen)} nodes have a snapshot from {day.isoformat()}",
                           hint="say " + " or ".join(f"{node}@{text}" for node in chosen))
        if chosen or by_id:
            meanings = [f"{node}'s snapshot from {day.isoformat()}" for node in chosen]
            meanings += [f"commit {commit[:12]}" for commit in by_id]
            raise RefError(f"ambiguous ref {text!r}: it names " + " and ".join(meanings),
                           hint="say " + " or ".join([f"{node}@{text}" for node in chosen]
                                                     + [commit[:12] for commit in by_id]))
        raise RefError(f"no snapshot was taken on {day.isoformat()} ({text!r}) and no tag is called that",
                       hint=f"say NODE@{text} for a node's newest snapshot on or before that day")

    def _hex_commits(self, prefix: str) -> list[str]:
        """The commits (sorted) whose id starts with ``prefix``."""
        store = self._require_store(prefix)
        if len(prefix) == 40:
            candidates = [prefix]
        else:
            try:
                candidates = store.git("rev-parse", f"--disambiguate={prefix}").decode().split()
            except StoreError:  # no object starts with it
                candidates = []
        if not candidates:
            return []
        out = store.git("cat-file", "--batch-check=%(objectname) %(objecttype)",
                        input="".join(f"{oid}\n" for oid in candidates).encode())
        return sorted(line.split()[0] for line in out.decode().splitlines() if line.endswith(" commit"))

    def _unknown(self, text: str) -> RefError:
        note = self.config.no_config_note()
        if note:  # the likeliest reason: the user's .snapver was not found
            return RefError(f"unknown ref {text!r}: {note}", hint=NO_CONFIG_HINT)
        tags = sorted(self._refs_under(store_refs.TAGS))
        patches = sorted(self._refs_under(store_refs.PATCHES))
        nodes = self._known_nodes()
        near = difflib.get_close_matches(text, nodes + tags + patches, n=3, cutoff=0.6)
        known = [f"nodes: {', '.join(nodes) or '(none)'}"]
        if tags:
            known.append(f"tags: {_few(tags)}")
        if patches:
            known.append(f"patches: {_few(patches)}")
        hint = (f"did you mean {' or '.join(near)}? " if near else "") + "; ".join(known)
        if os.path.isdir(text):  # a folder written without a slash
            hint = f"to read the folder {text} as a tree, say ./{text}; " + hint
        return RefError(f"unknown ref {text!r}: not a node, tag, patch, date or snapshot id", hint=hint)


def _few(names: list[str], limit: int = 8) -> str:
    return ", ".join(names[:limit]) + (f" (and {len(names) - limit} more)" if len(names) > limit else "")


def _parse_moment(text: str) -> datetime | None:
    """The latest moment ``NODE@text`` admits: the end of a day, or an ISO time (local)."""
    day = parse_day(text)
    try:
        if day is not None:
            return datetime.combine(day + timedelta(days=1), time.min).astimezone() - timedelta(microseconds=1)
        try:
            moment = datetime.fromisoformat(text)
        except ValueError:
            return None
        return moment if moment.tzinfo else moment.astimezone()
    except (OverflowError, ValueError):
        # Past the ends of the calendar: the last day admits every snapshot, the first none.
        edge = datetime.max if (day or moment).year == datetime.max.year else datetime.min
        return edge.replace(tzinfo=timezone.utc)
