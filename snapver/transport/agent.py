"""The node-side agent: sent as source to the node's own Python and run from stdin.

Standard library only, Python 3.8+. It never writes unless asked to by a write op, and
never follows symlinks. Protocol (both directions): a frame is a 4-byte big-endian
length and that many bytes; a request or reply is one frame of JSON; a stream is a
run of frames ended by an empty one. A request or reply of more than SQUEEZE_OVER
bytes travels zlib-compressed, its length word marked by the top bit (a listing of the
sglang tree: ~320 kB of JSON, ~70 kB on the wire). Paths travel as JSON strings decoded
with ``surrogateescape`` (``ensure_ascii`` keeps lone surrogates intact).
"""

import fnmatch
import gc
import json
import os
import re
import stat
import struct
import sys
import time
import zlib

CHUNK = 1 << 20
PROTOCOL = 1
SQUEEZED = 0x80000000  # in a message's length word: its JSON is zlib-compressed
SQUEEZE_OVER = 16 << 10


def _hashlib():
    # Imported when first needed: loading OpenSSL is a few ms of every agent's start, and an
    # unchanged re-pull, or the node that streams a first pull, hashes nothing.
    import hashlib

    return hashlib


def _sha1():
    try:
        return _hashlib().sha1(usedforsecurity=False)
    except TypeError:  # Python < 3.9
        return _hashlib().sha1()


class Channel:
    """Framed messages over this process's stdin and stdout."""

    def __init__(self, rfile, wfile):
        self.rfile = rfile
        self.wfile = wfile
        self.listed = []  # the paths of the last listing, in its order

    def read_exact(self, size):
        data = self.rfile.read(size)
        if data is None or len(data) != size:
            raise EOFError("connection closed")
        return data

    def recv(self):
        (size,) = struct.unpack(">I", self.read_exact(4))
        if size & SQUEEZED:
            return json.loads(zlib.decompress(self.read_exact(size & ~SQUEEZED)).decode("utf-8"))
        return json.loads(self.read_exact(size).decode("utf-8")) if size else None

    def recv_frame(self):
        (size,) = struct.unpack(">I", self.read_exact(4))
        return self.read_exact(size) if size else b""

    def send(self, message):
        data = json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        size = len(data)
        if size > SQUEEZE_OVER:
            data = zlib.compress(data, 1)
            size = len(data) | SQUEEZED
        self.wfile.write(struct.pack(">I", size) + data)
        self.wfile.flush()

    def send_frame(self, data):
        self.wfile.write(struct.pack(">I", len(data)))
        if data:
            self.wfile.write(data)

    def flush(self):
        self.wfile.flush()


class AgentError(Exception):
    """An error to report to the client; ``kind`` says which exit code it maps to."""

    def __init__(self, message, kind="remote"):
        Exception.__init__(self, message)
        self.kind = kind


def fs(path):
    return os.fsencode(path)


def _blob_digest(size):
    """A sha1 fed git's blob header: feed it the content for the blob id."""
    digest = _sha1()
    digest.update(b"blob %d\0" % size)
    return digest


def blob_id(data):
    digest = _blob_digest(len(data))
    digest.update(data)
    return digest.hexdigest()


def exclusion(patterns):
    """A function (name, relpath, is_dir) -> excluded?, for rsync/gitignore-like patterns:
    ``dir/`` matches folders only, a pattern with a ``/`` matches the path below
    site-packages, any other the name. Name patterns become one regex each (fnmatch rules)."""

    def one_regex(globs):
        if not globs:
            return lambda text: None
        return re.compile("|".join(fnmatch.translate(glob) for glob in globs)).match

    names, dir_names, paths, dir_paths = [], [], [], []
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


def check_tracked_root(site, tracked):
    """The tracked folder must exist and no component of it may be a symlink."""
    current = site
    for part in tracked.split("/"):
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except FileNotFoundError:
            raise AgentError("%s: no such file or directory" % current, "path")
        except PermissionError:
            raise AgentError("%s: permission denied" % current, "path")
        if stat.S_ISLNK(st.st_mode):
            raise AgentError("%s: is a symlink; tracked paths may not pass through one" % current, "path")
    if not stat.S_ISDIR(st.st_mode):
        raise AgentError("%s: not a directory" % current, "path")


def site_packages_of(requested):
    site = requested
    if not site:
        import sysconfig  # only here: every import is start-up time on the node

        site = sysconfig.get_paths()["purelib"]
    try:
        st = os.stat(site)
    except FileNotFoundError:
        raise AgentError("%s: no such site-packages directory" % site, "path")
    except PermissionError:
        raise AgentError("%s: permission denied" % site, "path")
    if not stat.S_ISDIR(st.st_mode):
        raise AgentError("%s: not a directory" % site, "path")
    if not os.access(site, os.R_OK | os.X_OK):
        raise AgentError("%s: permission denied" % site, "path")
    return site


def find_dists(site, tracked_paths):
    """The ``*.dist-info`` folders whose distribution owns a tracked path's top package."""
    tops = set(path.split("/")[0] for path in tracked_paths)
    found = []
    try:
        names = sorted(os.listdir(site))
    except OSError:
        return found
    for name in names:
        if not name.endswith(".dist-info"):
            continue
        folder = os.path.join(site, name)
        dist_name, _, version = name[: -len(".dist-info")].partition("-")
        owns = dist_name.replace("-", "_").lower() in set(t.lower() for t in tops)
        if not owns:
            try:
                with open(os.path.join(folder, "top_level.txt"), encoding="utf-8") as handle:
                    owns = bool(tops & set(line.strip() for line in handle))
            except OSError:
                pass
        if owns:
            try:
                with open(os.path.join(folder, "METADATA"), encoding="utf-8", errors="replace") as handle:
                    for line in handle:
                        if line.startswith("Name:"):
                            dist_name = line[5:].strip()
                        elif line.startswith("Version:"):
                            version = line[8:].strip()
                        elif not line.strip():
                            break
            except OSError:
                pass
            found.append([dist_name, version, name])
    return found


def op_hello(channel, request):
    site = site_packages_of(request.get("site_packages"))
    channel.send({
        "protocol": PROTOCOL,
        "hostname": os.uname().nodename,  # what socket.gethostname() returns, without importing socket
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "python": sys.executable,
        "site_packages": site,
        "dists": find_dists(site, request.get("paths") or []),
    })


SETTLE_NS = 100 * 10**6  # a file changed more recently than this may be half-way through a rewrite


def read_stable(full, st):
    """Read a file and make sure it did not change while read; returns (data, stat).

    A file rewritten in place (truncate, then write) passes through states that are
    neither old nor new; one whose ctime is under SETTLE_NS old is read only once it has
    stayed the same that long.
    """
    return _stable(full, st, _read_whole)


def hash_stable(full, st, algo=None, expect=None):
    """Like read_stable, for the hex digest of the content (``algo``: a hashlib name;
    None: its git blob id) without holding it: returns (digest, stat). A file that hashes
    to ``expect`` is taken at once however fresh: it holds that whole content, not a
    state half-way through a rewrite (this agent's own writes, hashed right after)."""
    return _stable(full, st, lambda fd, st: _hash_chunks(fd, st, algo), expect)


def _stable(full, st, read, expect=None):
    for _ in range(5):
        fd = os.open(full, os.O_RDONLY)  # os.read: no buffered file object
        try:
            result, length = read(fd, st)
            after = os.fstat(fd)
        finally:
            os.close(fd)
        key = (after.st_ino, after.st_size, after.st_mtime_ns, after.st_ctime_ns)
        if key == (st.st_ino, length, st.st_mtime_ns, st.st_ctime_ns):
            quiet = time.time_ns() - after.st_ctime_ns
            if quiet >= SETTLE_NS or (expect is not None and result == expect):
                return result, after
            time.sleep(min(SETTLE_NS, SETTLE_NS - quiet) / 1e9)
            st = os.lstat(full)
            if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == key:
                return result, after
        else:
            st = after
    raise AgentError("%s: keeps changing while read" % full, "remote")


def _read_whole(fd, st):
    data = os.read(fd, st.st_size + 1)  # one read() per file; +1 sees a file that grew
    if len(data) != st.st_size:  # it grew or shrank, or is too large for one read()
        os.lseek(fd, 0, os.SEEK_SET)
        with open(fd, "rb", buffering=0, closefd=False) as handle:
            data = handle.read()
    return data, len(data)


_CHUNK_BUFFER = []


def _hash_chunks(fd, st, algo):
    """(hex digest, bytes read) of fd, read in CHUNK pieces into one reused buffer: a
    bytes object per large file is a fresh mapping whose every page faults in. Stops at
    st_size + 1 bytes: enough to see that the file grew."""
    if not _CHUNK_BUFFER:
        _CHUNK_BUFFER.append(memoryview(bytearray(CHUNK)))
    buffer = _CHUNK_BUFFER[0]
    digest = _blob_digest(st.st_size) if algo is None else _hashlib().new(algo)
    length = 0
    while True:
        want = min(CHUNK, st.st_size + 1 - length)
        if want <= 0:
            break
        got = os.readv(fd, [buffer[:want]])
        if not got:
            break
        digest.update(buffer[:got])
        length += got
        if got < want and length == st.st_size:  # the end, where it was listed to be
            break
    return digest.hexdigest(), length


def walk(site, tracked_paths, patterns):
    """Yield (relpath, stat) for every file and symlink below the tracked paths."""
    excluded = exclusion(patterns)
    for tracked in tracked_paths:
        check_tracked_root(site, tracked)
        stack = [tracked]
        while stack:
            reldir = stack.pop()
            try:
                iterator = os.scandir(os.path.join(site, reldir))
            except PermissionError:
                raise AgentError("%s: permission denied" % os.path.join(site, reldir), "path")
            with iterator as entries:
                for entry in entries:
                    if entry.name.lower() == ".git":
                        continue  # a git tree cannot hold it (git fsck: hasDotgit): never tracked
                    rel = reldir + "/" + entry.name
                    st = entry.stat(follow_symlinks=False)
                    is_dir = stat.S_ISDIR(st.st_mode)
                    if excluded(entry.name, rel, is_dir):
                        continue
                    if is_dir:
                        stack.append(rel)
                    elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                        yield rel, st


def op_list(channel, request):
    """List the tree: kind, mode, size, times, inode, link target and git blob id.

    A file whose stat matches the client's cache keeps its cached blob id unless its
    times are too close to when that cache was made to be trusted (git's racy check).
    With ``delta``, such files are not sent, only counted (``same``): the client has
    their rows (its cache then holds no blob ids); cached paths no longer there are
    named (``gone``).
    """
    site = site_packages_of(request.get("site_packages"))
    cache = request.get("cache") or {}
    racy_after = int(request.get("cache_time_ns") or 0) - 2 * 10**9
    want_oids = request.get("oids", True)
    delta = bool(request.get("delta"))
    now_ns = time.time_ns()
    entries = []
    listed = []
    same = 0
    hashed = 0
    for rel, st in walk(site, request["paths"], request.get("exclude") or []):
        target = None
        oid = None
        if stat.S_ISLNK(st.st_mode):
            target = os.fsdecode(os.readlink(os.path.join(site, rel)))
            oid = blob_id(fs(target))
            size = len(fs(target))
        else:
            size = st.st_size
            cached = cache.get(rel)
            key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode]
            if cached and cached[:5] == key and max(st.st_mtime_ns, st.st_ctime_ns) < racy_after:
                if delta:
                    listed.append(rel)
                    same += 1
                    continue
                oid = cached[5]
            elif want_oids:
                full = os.path.join(site, rel)
                try:
                    oid, st = hash_stable(full, st, expect=_WROTE.get(full))
                except FileNotFoundError:
                    continue
                except PermissionError:
                    raise AgentError("%s: permission denied" % full, "path")
                size = st.st_size
                hashed += 1
        listed.append(rel)
        entries.append([rel, "l" if target is not None else "f", st.st_mode, size,
                        st.st_mtime_ns, st.st_ctime_ns, st.st_ino, oid, target])
    channel.listed = listed  # for a read of "listed" paths
    reply = {"now_ns": now_ns, "entries": entries, "hashed": hashed}
    if delta:
        present = set(listed)
        reply["same"] = same
        reply["gone"] = [path for path in cache if path not in present]
    channel.send(reply)


def op_read(channel, request):
    """Stream the content of the asked paths, in one (optionally zlib) stream.

    Record: path length (4) + path + kind (1: file, 2: link, 0: vanished, 3: unreadable,
    the content being the reason) + size (8) + content. A zero path length ends the
    stream. (An error reply in the middle of the stream would put it out of step.)
    """
    site = site_packages_of(request.get("site_packages"))
    level = request.get("compress_level", 0)
    compressor = zlib.compressobj(level) if level else None
    pending = []
    pending_size = [0]

    def emit(data):
        if compressor is not None:
            data = compressor.compress(data)
        if data:
            pending.append(data)
            pending_size[0] += len(data)
            if pending_size[0] >= CHUNK:
                flush_pending()

    def flush_pending():
        if pending:
            channel.send_frame(b"".join(pending))
            del pending[:]
            pending_size[0] = 0

    paths = channel.listed if request.get("listed") else request["paths"]
    channel.send({"ok": True})
    for rel in paths:
        full = os.path.join(site, rel)
        encoded = fs(rel)
        try:
            st = os.lstat(full)
            if stat.S_ISLNK(st.st_mode):
                kind, data = 2, fs(os.readlink(full))
            elif stat.S_ISREG(st.st_mode):
                kind = 1
                data, st = read_stable(full, st)
            else:
                kind, data = 0, b""
        except (FileNotFoundError, NotADirectoryError):
            kind, data = 0, b""
        except (AgentError, OSError) as exc:
            kind, data = 3, str(exc).encode("utf-8", "replace")
        emit(struct.pack(">I", len(encoded)) + encoded + struct.pack(">BQ", kind, len(data)))
        emit(data)
    emit(struct.pack(">I", 0))
    if compressor is not None:
        tail = compressor.flush()
        if tail:
            pending.append(tail)
    flush_pending()
    channel.send_frame(b"")
    channel.flush()


def op_hash(channel, request):
    """Hash the asked paths with a hashlib algorithm (sha256 for RECORD checks)."""
    site = site_packages_of(request.get("site_packages"))
    algo = request.get("algo", "sha256")
    result = {}
    for rel in request["paths"]:
        full = os.path.join(site, rel)
        try:
            st = os.lstat(full)
        except (FileNotFoundError, NotADirectoryError):
            result[rel] = None
            continue
        if stat.S_ISLNK(st.st_mode):
            result[rel] = _hashlib().new(algo, fs(os.readlink(full))).hexdigest()
        elif stat.S_ISREG(st.st_mode):
            result[rel] = hash_stable(full, st, algo)[0]
        else:
            result[rel] = None
    channel.send({"hashes": result})


# -- writing (push and rollback) ---------------------------------------------------------
# A write never follows a symlink below site-packages and never leaves the tracked paths:
# every component is lstat'ed, each file goes to a temporary file in its own folder and is
# renamed over the old one (uv installs hard-link files into a shared cache: writing in
# place would change the cache and every other venv linked to it).

_WRITE_RESULT = {}
# Blob id of every file this agent wrote (by full path): hashed again right after, to verify
# the write and for the snapshot that follows, such a file need not settle (hash_stable).
_WROTE = {}


def safe_target(site, rel, tracked):
    """The full path of ``rel``, refusing '..', absolute paths, paths outside the tracked
    paths and paths whose parent folders pass through a symlink."""
    parts = rel.split("/")
    if not rel or rel.startswith("/") or "\0" in rel or any(p in ("", ".", "..") for p in parts):
        raise AgentError("%s: unsafe path (absolute, empty or '..')" % rel, "unsafe")
    if not any(rel.startswith(t.strip("/") + "/") for t in tracked):
        raise AgentError("%s: outside the tracked paths %s" % (rel, ", ".join(tracked)), "unsafe")
    current = site
    for part in parts[:-1]:
        current = os.path.join(current, part)
        try:
            st = os.lstat(current)
        except (FileNotFoundError, NotADirectoryError):
            break  # the rest will be created
        if stat.S_ISLNK(st.st_mode):
            raise AgentError("%s: passes through the symlink %s" % (rel, current), "unsafe")
        if not stat.S_ISDIR(st.st_mode):
            raise AgentError("%s: %s is not a folder" % (rel, current), "unsafe")
    return os.path.join(site, rel)


def path_state(full, expect=None):
    """[kind, git blob id, st_mode] of a path, without following a symlink; None if absent.
    ``expect``: the blob id it should have (see hash_stable)."""
    try:
        st = os.lstat(full)
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(st.st_mode):
        return ["l", blob_id(fs(os.readlink(full))), st.st_mode]
    if stat.S_ISREG(st.st_mode):
        oid, st = hash_stable(full, st, expect=expect)
        return ["f", oid, st.st_mode]
    return ["other", None, st.st_mode]


def _roots_of(site, files, tracked):
    for root in tracked:
        if any(rel.startswith(root.strip("/") + "/") for rel in files):
            check_tracked_root(site, root.strip("/"))


def op_check(channel, request):
    """The current state of the given paths; unsafe ones are reported, never opened."""
    site = site_packages_of(request.get("site_packages"))
    tracked = request["tracked"]
    _roots_of(site, request["files"], tracked)
    states, unsafe = {}, {}
    for rel in request["files"]:
        try:
            states[rel] = path_state(safe_target(site, rel, tracked))
        except AgentError as exc:
            unsafe[rel] = str(exc)
    channel.send({"states": states, "unsafe": unsafe})


def _recv_stream(channel):
    chunks = []
    while True:
        frame = channel.recv_frame()
        if not frame:
            return b"".join(chunks)
        chunks.append(frame)


def _make_parents(site, full):
    """Create missing folders (owned like their parent when running as root)."""
    folder = os.path.dirname(full)
    missing = []
    while not os.path.lexists(folder):
        missing.append(folder)
        folder = os.path.dirname(folder)
    parent_st = os.lstat(folder)
    for folder in reversed(missing):
        os.mkdir(folder, 0o755)
        if os.geteuid() == 0:
            os.lchown(folder, parent_st.st_uid, parent_st.st_gid)


def _replace(full, kind, mode, data):
    """Write ``data`` beside ``full`` and rename it over: atomic, keeps owner (and mode if None)."""
    import tempfile

    folder, name = os.path.split(full)
    try:
        old = os.lstat(full)
    except FileNotFoundError:
        old = None
    owner = (old.st_uid, old.st_gid) if old is not None else None
    if owner is None and os.geteuid() == 0:
        parent = os.lstat(folder)
        owner = (parent.st_uid, parent.st_gid)
    if kind == "l":
        tmp = os.path.join(folder, ".snapver-%d-%s.tmp" % (os.getpid(), os.urandom(6).hex()))
        os.symlink(data, fs(tmp))
        try:
            if owner is not None and owner != (os.geteuid(), os.getegid()):
                os.lchown(tmp, owner[0], owner[1])
            os.rename(tmp, full)
        except BaseException:
            os.unlink(tmp)
            raise
        return
    if mode is None:
        mode = stat.S_IMODE(old.st_mode) if old is not None and stat.S_ISREG(old.st_mode) else 0o644
    fd, tmp = tempfile.mkstemp(prefix=".snapver-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            if owner is not None and owner != (os.geteuid(), os.getegid()):
                os.fchown(handle.fileno(), owner[0], owner[1])
            os.fchmod(handle.fileno(), mode)
            os.fsync(handle.fileno())
        os.rename(tmp, full)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def remove_stale_bytecode(full):
    """Remove ``__pycache__/<module>.<tag>[.opt-N].pyc`` of the module ``full`` (a .py file)."""
    import re

    folder, name = os.path.split(full)
    cache = os.path.join(folder, "__pycache__")
    try:
        if not stat.S_ISDIR(os.lstat(cache).st_mode):
            return []
        names = os.listdir(cache)
    except (FileNotFoundError, NotADirectoryError):
        return []
    pattern = re.compile(re.escape(name[:-3]) + r"\.[^.]+(\.opt-[0-9]+)?\.pyc\Z")
    removed = []
    for entry in names:
        if pattern.match(entry):
            os.unlink(os.path.join(cache, entry))
            removed.append(entry)
    return removed


def _prune_empty(site, full, tracked):
    """After a deletion, remove folders it left empty (an emptied __pycache__ too), up to
    the tracked root."""
    roots = set(os.path.join(site, t.strip("/")) for t in tracked)
    folder = os.path.dirname(full)
    cache = os.path.join(folder, "__pycache__")
    try:
        if stat.S_ISDIR(os.lstat(cache).st_mode) and not os.listdir(cache):
            os.rmdir(cache)
    except OSError:
        pass
    while folder not in roots and folder.startswith(site + "/"):
        try:
            os.rmdir(folder)
        except OSError:
            return
        folder = os.path.dirname(folder)


def op_write(channel, request):
    """Write files atomically after checking every one is as the client expects.

    ``files``: [path, kind ("f", "l" or None to delete), mode (permission bits, or None to
    keep the current ones), expected [kind, blob id] or None for absent]. Nothing is
    written unless every expectation holds (reply ``conflicts``) and every path is safe
    (reply ``unsafe``); else the reply is ``ok`` and one stream per file with content
    follows. ``write_done`` returns what was written, re-hashed from disk.
    """
    site = site_packages_of(request.get("site_packages"))
    tracked = request["tracked"]
    files = request["files"]
    _WRITE_RESULT.clear()
    _roots_of(site, [f[0] for f in files], tracked)
    targets, unsafe, conflicts = [], {}, {}
    for rel, kind, mode, expect in files:
        try:
            full = safe_target(site, rel, tracked)
        except AgentError as exc:
            unsafe[rel] = str(exc)
            continue
        state = path_state(full)
        if (state[:2] if state else None) != expect:
            conflicts[rel] = state
        targets.append((rel, full, kind, mode))
    if unsafe or conflicts:
        channel.send({"unsafe": unsafe, "conflicts": conflicts})
        return
    channel.send({"ok": True})
    written, deleted, bytecode, error = [], [], [], None
    folders = set()
    for rel, full, kind, mode in targets:
        try:
            data = _recv_stream(channel) if kind else None
        except EOFError:
            return  # the client went away mid-push: stop here, as a killed push would
        if error is not None:
            continue  # drain the rest of the streams, write nothing more
        try:
            if kind:
                _make_parents(site, full)
                _replace(full, kind, mode, data)
                written.append(rel)
                if kind == "f":
                    _WROTE[full] = blob_id(data)
            else:
                if os.path.lexists(full):
                    os.unlink(full)
                deleted.append(rel)
            folders.add(os.path.dirname(full))
            if rel.endswith(".py"):
                bytecode += [os.path.dirname(rel) + "/__pycache__/" + n for n in remove_stale_bytecode(full)]
            if not kind:
                _prune_empty(site, full, tracked)
        except OSError as exc:
            error = "%s: %s" % (rel, exc.strerror or exc)
    for folder in folders:
        try:
            fd = os.open(folder, os.O_RDONLY)
        except OSError:
            continue
        try:
            os.fsync(fd)
        except OSError:
            pass
        finally:
            os.close(fd)
    rehashed = {}
    for rel in written:
        full = os.path.join(site, rel)
        rehashed[rel] = path_state(full, _WROTE.get(full))
    _WRITE_RESULT.update({"written": rehashed,
                          "deleted": dict((rel, path_state(os.path.join(site, rel))) for rel in deleted),
                          "bytecode_removed": bytecode, "failure": error})


def op_write_done(channel, request):
    """What the last ``write`` did: each written path re-hashed from disk, deletions, bytecode."""
    channel.send(dict(_WRITE_RESULT) or {"written": {}, "deleted": {}, "bytecode_removed": [], "failure": None})


def op_run(channel, request):
    """Run ``sh -c COMMAND`` on the node (a health check), with the deployment's python first
    on PATH and its site-packages first on PYTHONPATH; returns the exit code and the
    tail of the output."""
    import subprocess

    site = site_packages_of(request.get("site_packages"))
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "/usr/bin:/bin")
    env["SNAPVER_PYTHON"] = sys.executable
    env["SNAPVER_SITE_PACKAGES"] = site
    env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    timeout = float(request.get("timeout") or 300)
    process = subprocess.Popen(["/bin/sh", "-c", request["command"]], stdin=subprocess.DEVNULL,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    timed_out = False
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(process.pid, 9)
        except OSError:
            pass
        output, _ = process.communicate()
    channel.send({"code": process.returncode, "timed_out": timed_out,
                  "output": output[-4000:].decode("utf-8", "replace")})


def op_ping(channel, request):
    channel.send({"pong": True})


OPS = {"ping": op_ping, "hello": op_hello, "list": op_list, "read": op_read, "hash": op_hash,
       "check": op_check, "write": op_write, "write_done": op_write_done, "run": op_run}


def serve(channel):
    while True:
        try:
            request = channel.recv()
        except EOFError:
            return
        if request is None or request.get("op") == "bye":
            return
        handler = OPS.get(request.get("op"))
        try:
            if handler is None:
                raise AgentError("unknown op %r" % request.get("op"))
            handler(channel, request)
        except AgentError as exc:
            channel.send({"error": str(exc), "kind": exc.kind})
        except OSError as exc:
            channel.send({"error": "%s: %s" % (getattr(exc, "filename", "") or "", exc.strerror or exc),
                          "kind": "path" if isinstance(exc, (FileNotFoundError, PermissionError)) else "remote"})


def main():
    # An agent serves one command and leaves: the cyclic collector would only walk the
    # listing's thousands of rows again and again (a few ms of listing sglang/srt), and
    # freeing every object at exit is work nobody waits for.
    gc.disable()
    serve(Channel(sys.stdin.buffer, sys.stdout.buffer))
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__" or __name__ == "snapver_agent":
    main()
