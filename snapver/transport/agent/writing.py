"""Writing files (``write``, ``check``, ``write_done``) and compiling sources before a push (``compile``)."""

import os
import re
import stat
import time

from .fsat import (
    DIR_FLAGS,
    O_CLOEXEC,
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
from .wire import Aborted, AgentError, blob_digest, blob_id, fs

# -- writing (push and rollback) ---------------------------------------------------------
# A write holds the node's write lock (flock on each tracked root it touches: two snapver
# writers, from any store, never interleave), checks every path against what the client
# expects, stages each new file as a temporary file in its own folder (streamed to disk in
# pieces, its blob id checked), and only then commits: right before each rename the path
# is checked again (compare-and-swap: the same inode and times as when it was hashed, or the
# same content), and its folder must still be the one the file was staged in. Nothing is
# followed through a symlink. Renaming over the old file, never writing into it, matters
# too: uv hard-links a venv's files into a shared cache.

LOCK_TIMEOUT = 60.0
_WRITE_RESULT = {}  # type: dict
# Blob id of every file this agent wrote (by path): hashed again right after, to verify the
# write and for the snapshot that follows, such a file need not settle (hash_stable).
WROTE = {}  # type: dict[str, str]


class Target(object):
    """One path of a write: what to make of it, what it must hold until then, and its staging."""

    __slots__ = ("rel", "reldir", "name", "kind", "mode", "expect", "oid", "size", "key", "old", "dir_fd", "tmp")

    def __init__(self, rel, kind, mode, expect, oid, size):
        self.rel, self.kind, self.mode, self.expect, self.oid, self.size = rel, kind, mode, expect, oid, size
        self.reldir, _, self.name = rel.rpartition("/")
        self.key = self.old = self.dir_fd = self.tmp = None


def _key(st):
    return None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)


def relpath_problem(rel, tracked):
    """Why ``rel`` may not be written ('..', absolute, outside the tracked paths), or None."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        return "%s: unsafe path (absolute, empty or '..')" % rel
    if not any(rel.startswith(t.strip("/") + "/") for t in tracked):
        return "%s: outside the tracked paths %s" % (rel, ", ".join(tracked))
    return None


def state_at(where, expect=None):
    """([kind, git blob id, st_mode], stat) of a path, without following a symlink or
    opening a special file; (None, None) if absent. ``expect``: see hash_stable."""
    try:
        st = lstat_at(where)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    if stat.S_ISLNK(st.st_mode):
        return ["l", blob_id(fs(readlink_at(where))), st.st_mode], st
    if stat.S_ISREG(st.st_mode):
        oid, st = hash_stable(where, st, expect=expect)
        return ["f", oid, st.st_mode], st
    return ["s", blob_id(special_text(st)), st.st_mode], st


def path_state(tree, rel, expect=None):
    """``state_at`` of ``rel``: absent when a folder on its way is; Unsafe through a link."""
    try:
        where = at_path(tree, rel)
    except (FileNotFoundError, NotADirectoryError):
        return None, None
    return state_at(where, expect)


def _touched_roots(tree, files, tracked):
    """The tracked roots ``files`` lie in, each checked to exist without a link on its way."""
    roots = []
    for root in tracked:
        root = root.strip("/")
        if any(rel.startswith(root + "/") for rel in files):
            os.close(open_tracked_root(tree, root))
            roots.append(root)
    return sorted(roots)


def lock_roots(tree, roots, timeout):
    """flock each root's folder (sorted: two writers cannot deadlock), waiting at most
    ``timeout`` seconds in all; returns the descriptors that hold the locks."""
    import fcntl

    held = []
    deadline = time.time() + timeout
    try:
        for root in roots:
            fd = open_tracked_root(tree, root)
            held.append(fd)
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.time() >= deadline:
                        raise AgentError("%s: another snapver is writing there; gave up after %g s"
                                         % (tree.full(root), timeout), "busy")
                    time.sleep(0.05)
    except BaseException:
        for fd in held:
            os.close(fd)
        raise
    return held


def op_check(channel, request):
    """The current state of the given paths; unsafe ones are reported, never opened."""
    site = site_packages_of(request.get("site_packages"))
    tracked = request["tracked"]
    tree = Tree(site)
    try:
        _touched_roots(tree, request["files"], tracked)
        states, unsafe = {}, {}
        for rel in request["files"]:
            problem = relpath_problem(rel, tracked)
            if problem:
                unsafe[rel] = problem
                continue
            try:
                states[rel] = path_state(tree, rel)[0]
            except Unsafe as exc:
                unsafe[rel] = exc.through(rel)
    finally:
        tree.close()
    channel.send({"states": states, "unsafe": unsafe})


def _check(tree, files, tracked):
    """Targets for ``files`` ([path, kind, mode, expected [kind, blob id] or None, blob id,
    size]), each with the state it was found in; and the unsafe and conflicting paths."""
    targets, unsafe, conflicts = [], {}, {}
    for rel, kind, mode, expect, oid, size in files:
        target = Target(rel, kind, mode, expect, oid, size)
        problem = relpath_problem(rel, tracked)
        if problem:
            unsafe[rel] = problem
            continue
        try:
            state, st = path_state(tree, rel)
        except Unsafe as exc:
            unsafe[rel] = exc.through(rel)
            continue
        target.key, target.old = _key(st), st
        found = state[:2] if state else None
        if found != expect:
            conflicts[rel] = {"expected": expect, "found": found}
            continue
        targets.append(target)
    return targets, unsafe, conflicts


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _stage(channel, tree, target, made):
    """Receive ``target``'s stream into a temporary file beside it, in pieces, and check its
    blob id. The whole stream is read even after an error, which is then raised."""
    error = None
    fd = None
    pieces = []
    try:
        target.dir_fd = tree.open_dir(target.reldir, create=made)
        target.tmp = ".snapver-%d-%s.tmp" % (os.getpid(), os.urandom(6).hex())
        if target.kind == "f":
            fd = os.open(target.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | O_CLOEXEC, 0o600,
                         dir_fd=target.dir_fd)
    except (OSError, AgentError) as exc:
        error = exc
        target.tmp = None
    digest = blob_digest(target.size)
    length = 0
    try:
        while True:
            frame = channel.recv_frame()
            if not frame:
                break
            length += len(frame)
            digest.update(frame)
            if error is None:
                try:
                    if fd is not None:
                        _write_all(fd, frame)
                    elif length <= 1 << 16:  # a link's target
                        pieces.append(frame)
                except OSError as exc:
                    error = exc
        if error is not None:
            raise error
        if length != target.size or digest.hexdigest() != target.oid:
            raise AgentError("%s: content arrived damaged (%d bytes, blob %s; expected %s bytes, %s)"
                             % (target.rel, length, digest.hexdigest(), target.size, target.oid))
        old = target.old
        owner = (old.st_uid, old.st_gid) if old is not None else None
        if owner is None and os.geteuid() == 0:
            parent = os.fstat(target.dir_fd)
            owner = (parent.st_uid, parent.st_gid)
        if owner == (os.geteuid(), os.getegid()):
            owner = None
        if fd is not None:
            mode = target.mode
            if mode is None:
                mode = stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else 0o644
            if owner is not None:
                os.fchown(fd, owner[0], owner[1])
            os.fchmod(fd, mode)
            os.fsync(fd)
        else:
            os.symlink(b"".join(pieces), target.tmp, dir_fd=target.dir_fd)
            if owner is not None:
                os.chown(target.tmp, owner[0], owner[1], dir_fd=target.dir_fd, follow_symlinks=False)
    finally:
        if fd is not None:
            os.close(fd)


def _drain(channel):
    while channel.recv_frame():
        pass


def _found_now(tree, target):
    """The [kind, blob id] ``target``'s path holds right now ("moved" when its folder is no
    longer the one it was staged in): unchanged inode and times stand for the content
    hashed when checked, anything else is hashed again."""
    if target.dir_fd is None:
        try:
            target.dir_fd = tree.open_dir(target.reldir)
        except (FileNotFoundError, NotADirectoryError):
            return None
    elif not tree.same_dir(target.reldir, target.dir_fd):
        return "moved"
    where = At(target.dir_fd, target.name, tree.full(target.rel))
    try:
        st = lstat_at(where)
    except FileNotFoundError:
        return None
    if _key(st) == target.key:
        return target.expect
    state = state_at(where)[0]
    return state[:2] if state else None


def _commit(tree, targets, partial, result):
    """Rename each staged file over its path (or delete it) while the path still holds what
    was expected; a path that changed stops the commit (``partial``: is skipped)."""
    for target in targets:
        try:
            found = _found_now(tree, target)
        except Unsafe:
            found = "moved"
        if found != target.expect:
            result["conflicts"][target.rel] = {"expected": target.expect,
                                               "found": found if found != "moved" else "folder moved or replaced"}
            if partial:
                continue
            return
        try:
            if target.kind:
                os.rename(target.tmp, target.name, src_dir_fd=target.dir_fd, dst_dir_fd=target.dir_fd)
                target.tmp = None
                result["written"][target.rel] = None
                if target.kind == "f":
                    WROTE[target.rel] = target.oid
            else:
                os.unlink(target.name, dir_fd=target.dir_fd)
                result["deleted"][target.rel] = None
        except OSError as exc:
            result["failure"] = "%s: %s" % (target.rel, exc.strerror or exc)
            return


def remove_stale_bytecode(dir_fd, name, keep_legacy=False):
    """Remove the bytecode of the module ``name`` (a .py file) in folder ``dir_fd``:
    ``__pycache__/<module>.<tag>[.opt-N].pyc``, and a legacy ``<module>.pyc`` beside it
    (Python 2 style: with the source gone, a sourceless import still loads it) unless
    ``keep_legacy``. Returns the removed paths, relative to the folder."""
    removed = []
    legacy = name[:-3] + ".pyc"
    if not keep_legacy:
        try:
            os.unlink(legacy, dir_fd=dir_fd)
            removed.append(legacy)
        except OSError:
            pass
    try:
        cache = os.open("__pycache__", DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return removed
    try:
        pattern = re.compile(re.escape(name[:-3]) + r"\.[^.]+(\.opt-[0-9]+)?\.pyc\Z")
        for entry in os.listdir(cache):
            if pattern.match(entry):
                os.unlink(entry, dir_fd=cache)
                removed.append("__pycache__/" + entry)
        return removed
    finally:
        os.close(cache)


def _prune_empty(tree, reldir, roots):
    """After a deletion, remove the folders it left empty (an emptied __pycache__ too), up to
    the tracked root."""
    try:
        fd = tree.open_dir(reldir)
        try:
            os.rmdir("__pycache__", dir_fd=fd)
        finally:
            os.close(fd)
    except (OSError, AgentError):
        pass
    _remove_empty(tree, reldir, roots)


def _remove_empty(tree, reldir, roots):
    while reldir not in roots and "/" in reldir and _rmdir(tree, reldir):
        reldir = reldir.rpartition("/")[0]


def _rmdir(tree, reldir):
    """Remove folder ``reldir`` if it is empty (reached without links); True if removed."""
    parent, _, name = reldir.rpartition("/")
    try:
        fd = tree.open_dir(parent)
        try:
            os.rmdir(name, dir_fd=fd)
        finally:
            os.close(fd)
    except (OSError, AgentError):
        return False
    return True


def op_write(channel, request):
    """Write files atomically, each only while it holds what the client expects.

    ``files``: [path, kind ("f", "l" or None to delete), mode (permission bits, or None to
    keep the current ones), expected [kind, blob id] or None for absent, blob id and size
    of the new content]. Unsafe paths refuse the whole write (reply ``unsafe``); so do
    paths that do not hold what is expected (``conflicts``) unless ``partial`` (an undo:
    those are skipped, the rest written). Else the reply is ``ok`` with the ``skipped``
    paths, and one stream follows per file with content (not for skipped ones); a stream
    whose length word is ABORT_FRAME abandons the write. ``write_done`` returns what was
    written, each path re-hashed from disk, and the conflicts met at the moment of writing.
    """
    site = site_packages_of(request.get("site_packages"))
    tracked = request["tracked"]
    partial = bool(request.get("partial"))
    result = {"written": {}, "deleted": {}, "bytecode_removed": [], "failure": None, "conflicts": {},
              "skipped": {}, "aborted": False}  # type: dict
    _WRITE_RESULT.clear()
    _WRITE_RESULT.update(result)
    tree = Tree(site)
    held = []
    targets = []
    made = []  # type: list[str]
    try:
        roots = _touched_roots(tree, [f[0] for f in request["files"]], tracked)
        held = lock_roots(tree, roots, float(request.get("lock_timeout") or LOCK_TIMEOUT))
        targets, unsafe, conflicts = _check(tree, request["files"], tracked)
        if unsafe or (conflicts and not partial):
            channel.send({"unsafe": unsafe, "conflicts": conflicts})
            return
        result["skipped"] = conflicts
        channel.send({"ok": True, "skipped": sorted(conflicts)})
        try:
            for target in targets:
                if not target.kind:
                    continue
                if result["failure"] is not None:
                    _drain(channel)  # write nothing more; keep the protocol in step
                    continue
                try:
                    _stage(channel, tree, target, made)
                except (OSError, AgentError) as exc:
                    result["failure"] = "%s: %s" % (target.rel, getattr(exc, "strerror", None) or exc)
        except Aborted:
            result["aborted"] = True
            return
        except EOFError:
            return  # the client went away mid-stream: nothing was committed
        if result["failure"] is None:
            _commit(tree, targets, partial, result)
        _finish(tree, tracked, targets, result)
    finally:
        for target in targets:
            if target.tmp is not None:  # staged, never committed
                try:
                    os.unlink(target.tmp, dir_fd=target.dir_fd)
                except OSError:
                    pass
            if target.dir_fd is not None:
                os.close(target.dir_fd)
        for reldir in reversed(made):  # folders made for files that were never committed
            _rmdir(tree, reldir)
        for fd in held:
            os.close(fd)
        tree.close()
        _WRITE_RESULT.update(result)


def _finish(tree, tracked, targets, result):
    """After the commit: stale bytecode, emptied folders, fsync, and each path re-hashed."""
    roots = set(root.strip("/") for root in tracked)
    folders = {}
    for target in targets:
        if target.rel not in result["written"] and target.rel not in result["deleted"]:
            continue
        folders[target.reldir] = target.dir_fd
        if target.rel.endswith(".py"):
            # A .pyc beside a module this write adds is that module's only code before it (a
            # sourceless install), which undoing the write must find again; or this write put it there.
            keep = target.expect is None or target.rel[:-3] + ".pyc" in result["written"]
            result["bytecode_removed"] += [target.reldir + "/" + n
                                           for n in remove_stale_bytecode(target.dir_fd, target.name, keep)]
        if not target.kind:
            _prune_empty(tree, target.reldir, roots)
    for fd in folders.values():
        try:
            os.fsync(fd)
        except OSError:
            pass
    for found, expect in ((result["written"], WROTE), (result["deleted"], {})):
        for rel in found:
            try:
                found[rel] = path_state(tree, rel, expect.get(rel))[0]
            except AgentError as exc:  # a folder swapped since: the client's check fails it
                found[rel] = ["moved", str(exc), 0]


def op_write_done(channel, request):
    """What the last ``write`` did: each written path re-hashed from disk, deletions,
    bytecode, the conflicts met at the moment of writing, a failure, an abort."""
    channel.send(dict(_WRITE_RESULT) or {"written": {}, "deleted": {}, "bytecode_removed": [], "failure": None,
                                         "conflicts": {}, "skipped": {}, "aborted": False})


# The largest source the compile op holds in memory at once: a node keeps within ~50 MiB.
COMPILE_MAX = 16 << 20


def op_compile(channel, request):
    """Compile Python sources with this node's own interpreter, before a push writes them.

    ``files``: [path, size]; one stream follows per file (its content). Each is compiled
    as ``compile(source, path, "exec", dont_inherit=True)`` would import it, one at a time
    (memory: the largest file). Reply ``errors``: {path: [line or None, message]} for every
    file this Python refuses; ``unchecked``: paths larger than COMPILE_MAX (never held).
    """
    import warnings

    errors = {}
    unchecked = []
    try:
        for path, size in request["files"]:
            if size > COMPILE_MAX:
                unchecked.append(path)
                _drain(channel)
                continue
            pieces = []
            held = 0
            while True:
                piece = channel.recv_frame()
                if not piece:
                    break
                held += len(piece)
                if held <= COMPILE_MAX:
                    pieces.append(piece)
            if held > COMPILE_MAX:
                unchecked.append(path)
                continue
            source = b"".join(pieces)
            del pieces
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # SyntaxWarning is not a refusal
                    compile(source, path, "exec", dont_inherit=True)
            except SyntaxError as exc:  # IndentationError, TabError too
                errors[path] = [exc.lineno, "%s: %s" % (type(exc).__name__, exc.msg)]
            except (ValueError, RecursionError, MemoryError, OverflowError) as exc:
                errors[path] = [None, "%s: %s" % (type(exc).__name__, exc)]
            del source
    except Aborted:
        channel.send({"aborted": True, "errors": errors, "unchecked": unchecked})
        return
    channel.send({"errors": errors, "unchecked": unchecked})
