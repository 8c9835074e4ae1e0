"""The ``list`` op: the tracked tree walked by descriptor, each file's row, a client's stat cache checked."""

import fnmatch
import json
import os
import re
import stat
import time
import zlib

from .fsat import (
    DIR_FLAGS,
    S_ISDIR,
    S_ISREG,
    At,
    Tree,
    Unsafe,
    at_path,
    lstat_at,
    open_tracked_root,
    readlink_at,
    site_packages_of,
    special_text,
)
from .reading import hash_stable
from .wire import AgentError, blake2b_256, blob_id, fs
from .writing import WROTE


def exclusion(patterns):
    """A function (name, relpath, is_dir) -> excluded?, for rsync/gitignore-like patterns:
    ``dir/`` matches folders only, a pattern with a ``/`` matches the path below
    site-packages, any other the name. Name patterns become one regex each (fnmatch rules)."""

    def one_regex(globs):
        if not globs:
            return lambda text: None
        return re.compile("|".join(fnmatch.translate(glob) for glob in globs)).match

    names, dir_names, paths, dir_paths = [], [], [], []  # type: list[str], list[str], list[str], list[str]
    for pattern in patterns:
        dir_only = pattern.endswith("/")
        glob = pattern[:-1] if dir_only else pattern
        if "/" in glob:
            (dir_paths if dir_only else paths).append(glob.lstrip("/"))
        else:
            (dir_names if dir_only else names).append(glob)
    name_match, dir_name_match = one_regex(names), one_regex(dir_names)
    path_match, dir_path_match = one_regex(paths), one_regex(dir_paths)

    def excluded(name, relpath, is_dir):
        if name_match(name) or path_match(relpath):
            return True
        return is_dir and bool(dir_name_match(name) or dir_path_match(relpath))

    return excluded


def walk(tree, tracked_paths, patterns):
    """Yield (relpath, stat, dir_fd, name) for every file, symlink and special file below
    the tracked paths, walking folders by descriptor (a folder swapped for a link mid-walk
    fails the listing instead of being followed). The folder ``dir_fd`` stays open until
    the next item is asked for: ``At(dir_fd, name, ...)`` reaches the item meanwhile (made
    only for the items read: an unchanged listing needs none)."""
    excluded = exclusion(patterns) if patterns else None  # None: nothing to test per name
    for tracked in tracked_paths:
        root_fd = open_tracked_root(tree, tracked)
        try:
            yield from _walk_folder(tree, root_fd, tracked.strip("/"), excluded)
        finally:
            os.close(root_fd)


def _walk_folder(tree, fd, reldir, excluded):
    try:
        with os.scandir(fd) as iterator:
            entries = [(entry.name, entry.stat(follow_symlinks=False)) for entry in iterator]
    except PermissionError:
        raise AgentError("%s: permission denied" % tree.full(reldir), "path")
    prefix = reldir + "/"
    for name, st in entries:
        if name[0] == "." and (name.lower() == ".git" or (name.startswith(".snapver-") and name.endswith(".tmp"))):
            # .git: a git tree cannot hold it (git fsck: hasDotgit), never tracked;
            # .snapver-*.tmp: a file another snapver is staging, not part of the tree (yet).
            continue
        rel = prefix + name
        is_dir = S_ISDIR(st.st_mode)
        if excluded is not None and excluded(name, rel, is_dir):
            continue
        if not is_dir:
            yield rel, st, fd, name
            continue
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            continue  # removed since listed
        except PermissionError:
            raise AgentError("%s: permission denied" % tree.full(rel), "path")
        except OSError:  # no longer a folder (a symlink now): never followed
            raise AgentError("%s: changed while listed (a folder swapped for a link?)" % tree.full(rel), "remote")
        try:
            yield from _walk_folder(tree, child, rel, excluded)  # delegated in C, not re-yielded per level
        finally:
            os.close(child)


def _row_of(where, st, oid_wanted, expect=None):
    """(kind, size, st, oid, target) of a listed path; oid None when not wanted."""
    if stat.S_ISLNK(st.st_mode):
        target = fs(readlink_at(where))
        return "l", len(target), st, blob_id(target), os.fsdecode(target)
    if stat.S_ISREG(st.st_mode):
        if not oid_wanted:
            return "f", st.st_size, st, None, None
        oid, st = hash_stable(where, st, expect=expect)
        return "f", st.st_size, st, oid, None
    text = special_text(st)
    return "s", len(text), st, blob_id(text), None


def _listing_row(rel, kind, size, st, oid, target):
    """A listing's row of a path: kind, mode, size, times, inode, blob id, link target."""
    return [rel, kind, st.st_mode, size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, oid, target]


def _unpacked_cache(frame):
    """The cache of a ``cache_frame``; one the client's store holds damaged is no cache
    (every file is hashed, and the client, unable to read it either, trusts none)."""
    try:
        cache = json.loads(zlib.decompress(frame).decode("ascii"))
    except (zlib.error, ValueError):  # UnicodeDecodeError is a ValueError
        return {}
    return cache if isinstance(cache, str) else {}


class _Records(object):
    """The client's records (see ``op_list``), checked as a whole: ``in`` takes every record
    of the walk as found; ``all_found`` then says whether the records taken, sorted, hash
    to the client's digest: then each was among the client's, and none of the client's
    is missing (as many, paths unique). If not, the frame is decoded and ``in`` looks up.
    ``count``: how many records the client has (a different number taken needs no hash)."""

    def __init__(self, frame, digest, count):
        self.frame, self.digest, self.count = frame, digest, count
        self.taken = []
        self.decoded = None

    def __contains__(self, record):
        if self.decoded is not None:
            return record in self.decoded
        self.taken.append(record)
        return True

    def __len__(self):
        return len(self.decoded) if self.decoded is not None else len(self.taken)

    def __iter__(self):
        return iter(self.decoded if self.decoded is not None else self.taken)

    def all_found(self):
        if len(self.taken) == self.count:
            text = "\0\0".join(sorted(self.taken))
            if blake2b_256(text.encode("utf-8", "surrogatepass")).hexdigest() == self.digest:
                return True
        cache = _unpacked_cache(self.frame)
        self.decoded = set(cache.split("\0\0")) if isinstance(cache, str) and cache else set()
        return False


def op_list(channel, request):
    """List the tree: kind ("f", "l", or "s" for a FIFO, socket or device: never opened),
    mode, size, times, inode, link target and git blob id.

    A file whose stat matches the client's cache keeps its cached blob id unless its
    times are too close to when that cache was made to be trusted (git's racy check).
    With ``delta``, such files are not sent, only counted (``same``): the client has
    their rows (its cache then holds no blob ids); cached paths no longer there are
    named (``gone``). A delta's cache may come as one string of records, "path NUL size
    mtime_ns ctime_ns ino mode" each, two NULs between them: a file is unchanged when its
    own record is among them (one string decodes faster than a JSON object).
    With ``cache_frame``, the cache comes in the frame after the request, zlib-compressed.
    With ``records_digest`` and ``records`` too (the BLAKE2b of the records, sorted, as one
    string, and how many), the frame is decoded only if the files' own records are not as
    many or, sorted, hash otherwise (``_Records``): a tree found as it was costs no
    decompressing, parsing or set of records.
    """
    site = site_packages_of(request.get("site_packages"))
    cache = request.get("cache") or {}
    delta = bool(request.get("delta"))
    records = None  # type: _Records | set[str] | None
    if request.get("cache_frame"):  # the cache follows as its JSON text, compressed as the client keeps it
        frame = channel.recv_frame()
        digest, count = request.get("records_digest"), request.get("records")
        if delta and isinstance(digest, str) and isinstance(count, int):
            records, cache = _Records(frame, digest, count), {}
        else:
            cache = _unpacked_cache(frame)
    racy_after = int(request.get("cache_time_ns") or 0) - 2 * 10**9
    want_oids = request.get("oids", True)
    if isinstance(cache, str):
        records = set(cache.split("\0\0")) if delta else None
        cache = {}
    now_ns = time.time_ns()
    entries = []
    listed = []
    same = 0
    in_cache = 0  # listed paths the cache names: all of them, and none is gone
    hashed = 0
    tree = Tree(site)
    try:
        for rel, st, dir_fd, name in walk(tree, request["paths"], request.get("exclude") or []):
            oid = None
            if records is not None:
                mtime_ns, ctime_ns = st.st_mtime_ns, st.st_ctime_ns
                if (mtime_ns < racy_after and ctime_ns < racy_after and S_ISREG(st.st_mode)
                        and "%s\0%d %d %d %d %d" % (rel, st.st_size, mtime_ns, ctime_ns, st.st_ino, st.st_mode)
                        in records):  # a _Records takes every record, and is asked once the walk is done
                    listed.append(rel)
                    same += 1
                    continue
            cached = cache.get(rel)
            if cached is not None:
                in_cache += 1
                mtime_ns, ctime_ns = st.st_mtime_ns, st.st_ctime_ns
                if (S_ISREG(st.st_mode) and cached[:5] == [st.st_size, mtime_ns, ctime_ns, st.st_ino, st.st_mode]
                        and mtime_ns < racy_after and ctime_ns < racy_after):
                    if delta:
                        listed.append(rel)
                        same += 1
                        continue
                    oid = cached[5]
            if oid is None:
                where = At(dir_fd, name, (tree, rel))
                try:
                    kind, size, st, oid, target = _row_of(where, st, want_oids, WROTE.get(rel))
                except FileNotFoundError:
                    in_cache -= cached is not None  # gone since walked: not listed
                    continue
                except PermissionError:
                    raise AgentError("%s: permission denied" % where, "path")
                hashed += kind == "f" and oid is not None
            else:
                kind, size, target = "f", st.st_size, None
            listed.append(rel)
            entries.append(_listing_row(rel, kind, size, st, oid, target))
        if isinstance(records, _Records) and not records.all_found():
            not_same, rehashed, vanished = _list_not_found(tree, records, want_oids, entries)
            same -= not_same
            hashed += rehashed
            if vanished:
                listed = [rel for rel in listed if rel not in vanished]
    finally:
        tree.close()
    channel.listed = listed  # for a read of "listed" paths
    reply = {"now_ns": now_ns, "entries": entries, "hashed": hashed}
    if delta:
        reply["same"] = same
        reply["gone"] = _gone(records, cache, listed, same, in_cache)
    channel.send(reply)


def _list_not_found(tree, records, want_oids, entries):
    """Some record is not the client's: each file taken as unchanged is looked up in the
    decoded records now, and one that is not there is listed (into ``entries``) as the walk
    would have (reached by its path: no folder on the way may be a link). Returns how many
    taken files were not the client's, how many of them were hashed, and the paths gone
    since the walk."""
    not_same = hashed = 0
    vanished = set()
    for record in records.taken:
        if record in records:
            continue
        not_same += 1
        rel = record.split("\0", 1)[0]
        try:
            where = at_path(tree, rel)
            st = lstat_at(where)
            if S_ISDIR(st.st_mode):  # a folder where the walk found a file: listed by neither
                raise AgentError("%s: changed while listed (a file swapped for a folder)"
                                 % tree.full(rel), "remote")
            kind, size, st, oid, target = _row_of(where, st, want_oids, WROTE.get(rel))
        except FileNotFoundError:
            vanished.add(rel)  # gone since walked: not listed
            continue
        except Unsafe as exc:
            raise AgentError("%s (changed while listed)" % exc.through(rel), "remote")
        except PermissionError:
            raise AgentError("%s: permission denied" % tree.full(rel), "path")
        hashed += kind == "f" and oid is not None
        entries.append(_listing_row(rel, kind, size, st, oid, target))
    return not_same, hashed, vanished


def _gone(records, cache, listed, same, in_cache):
    """A delta's cached paths that the walk no longer found."""
    if records is not None and same == len(records):  # each record found (once: paths are unique)
        return []
    if records is not None:
        present = set(listed)
        return sorted(path for path in (record.split("\0", 1)[0] for record in records) if path not in present)
    if in_cache == len(cache):
        return []
    present = set(listed)
    return [path for path in cache if path not in present]
