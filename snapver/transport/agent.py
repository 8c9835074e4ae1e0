"""The node-side agent: sent as source to the node's own Python and run from stdin.

Standard library only, Python 3.8+. It never writes unless asked to by a write op, and
never follows symlinks. Protocol (both directions): a frame is a 4-byte big-endian
length and that many bytes; a request or reply is one frame of JSON; a stream is a
run of frames ended by an empty one. A request or reply of more than SQUEEZE_OVER
bytes travels zlib-compressed, its length word marked by the top bit (a listing of the
sglang tree: ~320 kB of JSON, ~70 kB on the wire). Paths travel as JSON strings decoded
with ``surrogateescape`` (``ensure_ascii`` keeps lone surrogates intact).
"""

import errno
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
# Files above this travel in CHUNK pieces, never held whole (op_read); smaller ones are
# read with one read() and sent with their neighbours in one frame (the sglang tree's way).
BIG_FILE = 4 << 20
PROTOCOL = 1
# The oldest Python the agent runs on: the bootstrap (transport/base.py) refuses older ones
# before this file is even compiled, and the client checks hello's python_version again.
MIN_PYTHON = (3, 8)
SQUEEZED = 0x80000000  # in a message's length word: its JSON is zlib-compressed
SQUEEZE_OVER = 16 << 10
# The first bytes the agent writes, before any frame: the client checks them, so that
# whatever the node printed before the agent (a login banner, a printing sitecustomize)
# is named as such instead of being read as a frame's length.
GREETING = b"\x00snapver-agent/1\n"


class Record(object):
    """The kinds of a read stream's records (``op_read``): path length (4), path, kind (1),
    size (8), content. A STREAMED record's content comes in pieces (``_stream_file``),
    ended by a zero length and one byte, SAME or CHANGED."""

    GONE = 0  # vanished since asked for: no content
    FILE = 1
    LINK = 2  # the content: the link's target
    UNREADABLE = 3  # the content: the reason (an error reply would put the stream out of step)
    SPECIAL = 4  # the content: the line that stands for a FIFO, socket or device
    STREAMED = 5  # a file above BIG_FILE, never held whole
    SAME, CHANGED = 1, 0  # a STREAMED record's last byte: the file stayed the same while read, or not


def _hashlib():
    # Imported when first needed: loading OpenSSL is a few ms of every agent's start, and an
    # unchanged re-pull, or the node that streams a first pull, hashes nothing.
    import hashlib

    return hashlib


def _blake2b(data):
    # CPython's own BLAKE2 module, not hashlib: an unchanged re-pull hashes nothing else,
    # and hashlib's import loads OpenSSL (~5 ms of the agent's CPU; _blake2: 0.4 ms).
    try:
        from _blake2 import blake2b
    except ImportError:
        blake2b = _hashlib().blake2b
    return blake2b(data, digest_size=32)


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
        if size == ABORT_FRAME:
            raise Aborted()
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

    def send_frame_parts(self, head, body):
        """One frame of ``head`` then ``body`` (a view of a reused buffer: written, never joined)."""
        self.wfile.write(struct.pack(">I", len(head) + len(body)) + head)
        self.wfile.write(body)

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
        # How this agent was loaded: "bytecode" (the client's, same magic) or "source".
        "loaded": "bytecode" if globals().get("L") == 1 else "source",
    })


# -- paths below site-packages, never through a symlink ----------------------------------
# Every path is reached one component at a time, each opened relative to its parent's
# descriptor with O_NOFOLLOW (as rsync 3.4 does since CVE-2024-12747): a folder swapped
# for a symlink at any moment fails that path instead of leading out of the tree.
O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
S_ISDIR, S_ISREG = stat.S_ISDIR, stat.S_ISREG  # one lookup less per listed name
DIR_FLAGS = os.O_RDONLY | O_DIRECTORY | os.O_NOFOLLOW | O_CLOEXEC
# A FIFO put in a file's place would block an open for reading: never block, check the kind
# on the descriptor.
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | O_CLOEXEC


class Unsafe(AgentError):
    """A folder on a path's way that is a symlink (or not a folder): never followed."""

    def __init__(self, path, what):
        AgentError.__init__(self, "%s: %s" % (path, what), "unsafe")
        self.path, self.what = path, what

    def through(self, rel):
        """The refusal for ``rel``, whose way passes through this folder."""
        if self.what == "is a symlink":
            return "%s: passes through the symlink %s" % (rel, self.path)
        return "%s: %s is not a folder" % (rel, self.path)


class At(object):
    """A name in an open folder (``dir_fd``); ``shown`` is its path for messages: a string,
    or a ``(tree, rel)`` pair joined only when shown (a listing makes one per file and
    shows almost none: the join was ~10% of listing 12,000 files)."""

    __slots__ = ("dir_fd", "name", "_shown")

    def __init__(self, dir_fd, name, shown):
        self.dir_fd, self.name, self._shown = dir_fd, name, shown

    @property
    def shown(self):
        if not isinstance(self._shown, str):
            tree, rel = self._shown
            self._shown = tree.full(rel)
        return self._shown

    def __str__(self):
        return self.shown


def lstat_at(where):
    """lstat of a path (a str, for tests and the site itself) or of an ``At``."""
    if isinstance(where, At):
        return os.stat(where.name, dir_fd=where.dir_fd, follow_symlinks=False)
    return os.lstat(where)


def readlink_at(where):
    if isinstance(where, At):
        return os.readlink(where.name, dir_fd=where.dir_fd)
    return os.readlink(where)


def open_file_at(where):
    """A descriptor of a regular file, opened without following a link or blocking."""
    try:
        if isinstance(where, At):
            fd = os.open(where.name, FILE_FLAGS, dir_fd=where.dir_fd)
        else:
            fd = os.open(where, FILE_FLAGS)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link put in the file's place since its lstat
            raise NotRegular(str(where))
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(str(where))
    return fd


class NotRegular(OSError):
    """A path listed as a regular file that is something else now (never read)."""

    def __str__(self):
        return "%s: no longer a regular file" % self.args[0]


def special_text(st):
    """What a snapshot records for a FIFO, socket or device (never opened): a line git keeps."""
    mode = st.st_mode
    if stat.S_ISFIFO(mode):
        what = "fifo"
    elif stat.S_ISSOCK(mode):
        what = "socket"
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        what = "%s device %d,%d" % ("character" if stat.S_ISCHR(mode) else "block",
                                    os.major(st.st_rdev), os.minor(st.st_rdev))
    else:
        what = "file of type %o" % stat.S_IFMT(mode)
    return ("snapver: special file: %s\n" % what).encode("ascii")


class Tree(object):
    """site-packages, opened once (its own path may pass through links: it is configured);
    every folder below it is opened with ``open_dir``."""

    def __init__(self, site):
        self.site = site
        self.fd = os.open(site, os.O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        self._last = None  # (reldir, fd) of the last folder asked for: paths come in runs

    def close(self):
        self._forget()
        os.close(self.fd)

    def _forget(self):
        if self._last is not None:
            os.close(self._last[1])
            self._last = None

    def full(self, rel):
        return os.path.join(self.site, rel)

    def open_dir(self, reldir, create=None):
        """A new descriptor of folder ``reldir`` (the caller closes it). A component that is
        a symlink or not a folder raises Unsafe; a missing one FileNotFoundError, unless
        ``create`` is a list: then it is made (owned like its parent when we are root) and
        its path appended to the list."""
        fd = os.dup(self.fd)
        done = []
        try:
            for part in reldir.split("/") if reldir else ():
                done.append(part)
                try:
                    child = os.open(part, DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if create is None:
                        raise FileNotFoundError(errno.ENOENT, "no such file or directory", self.full("/".join(done)))
                    os.mkdir(part, 0o755, dir_fd=fd)
                    if os.geteuid() == 0:
                        parent = os.fstat(fd)
                        os.chown(part, parent.st_uid, parent.st_gid, dir_fd=fd, follow_symlinks=False)
                    create.append("/".join(done))
                    child = os.open(part, DIR_FLAGS, dir_fd=fd)
                except OSError as exc:
                    raise self._why(fd, part, "/".join(done), exc)
                os.close(fd)
                fd = child
        except BaseException:
            os.close(fd)
            raise
        return fd

    def dir_for(self, reldir):
        """``open_dir`` kept open for the next path in the same folder (do not close it)."""
        if self._last is not None and self._last[0] == reldir:
            return self._last[1]
        self._forget()
        fd = self.open_dir(reldir)
        self._last = (reldir, fd)
        return fd

    def _why(self, fd, part, shown, exc):
        try:
            st = os.stat(part, dir_fd=fd, follow_symlinks=False)
        except OSError:
            return exc
        if stat.S_ISLNK(st.st_mode):
            return Unsafe(self.full(shown), "is a symlink")
        if not stat.S_ISDIR(st.st_mode):
            return Unsafe(self.full(shown), "not a folder")
        return exc

    def same_dir(self, reldir, fd):
        """True while ``reldir`` still leads, without links, to the folder ``fd`` is open on."""
        try:
            now = self.open_dir(reldir)
        except (OSError, AgentError):
            return False
        try:
            a, b = os.fstat(now), os.fstat(fd)
            return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
        finally:
            os.close(now)


def open_tracked_root(tree, tracked):
    """A descriptor of a tracked folder; it must exist, and no component may be a symlink."""
    try:
        return tree.open_dir(tracked.strip("/"))
    except FileNotFoundError as exc:
        raise AgentError("%s: no such file or directory" % (exc.filename or tree.full(tracked)), "path")
    except PermissionError:
        raise AgentError("%s: permission denied" % tree.full(tracked), "path")
    except Unsafe as exc:
        raise AgentError("%s; tracked paths may not pass through one" % exc, "path")


def at_path(tree, rel):
    """An ``At`` for ``rel`` (its folder from ``tree.dir_for``)."""
    reldir, _, name = rel.rpartition("/")
    return At(tree.dir_for(reldir), name, tree.full(rel))


SETTLE_NS = 100 * 10**6  # a file changed more recently than this may be half-way through a rewrite


def read_stable(where, st):
    """Read a file and make sure it did not change while read; returns (data, stat).

    ``where``: an ``At`` (or a path). A file rewritten in place (truncate, then write)
    passes through states that are neither old nor new; one whose ctime is under
    SETTLE_NS old is read only once it has stayed the same that long.
    """
    return _stable(where, st, _read_whole)


def hash_stable(where, st, algo=None, expect=None):
    """Like read_stable, for the hex digest of the content (``algo``: a hashlib name;
    None: its git blob id) without holding it: returns (digest, stat). A file that hashes
    to ``expect`` is taken at once however fresh: it holds that whole content, not a
    state half-way through a rewrite (this agent's own writes, hashed right after)."""
    return _stable(where, st, lambda fd, st: _hash_chunks(fd, st, algo), expect)


def _stable(where, st, read, expect=None):
    for _ in range(5):
        fd = open_file_at(where)  # os.read: no buffered file object
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
            st = lstat_at(where)
            if (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) == key:
                return result, after
        else:
            st = after
    raise AgentError("%s: keeps changing while read" % where, "remote")


class TooBig(Exception):
    """A file above BIG_FILE (grown since listed): it travels in pieces (``_stream_file``)."""


def _read_whole(fd, st):
    if st.st_size > BIG_FILE:
        raise TooBig()
    data = os.read(fd, st.st_size + 1)  # one read() per file; +1 sees a file that grew
    if len(data) != st.st_size:  # it grew or shrank, or the read came short
        pieces, held = [data], len(data)
        while held <= BIG_FILE:  # never more: a file grown past it is streamed
            more = os.read(fd, BIG_FILE + 1 - held)
            if not more:
                break
            pieces.append(more)
            held += len(more)
        if held > BIG_FILE:
            raise TooBig()
        data = b"".join(pieces)
    return data, len(data)


_CHUNK_BUFFER = []


def _pieces(fd, size):
    """Views of fd's content, read in CHUNK pieces into one reused buffer (each view is
    valid until the next is asked for): a bytes object per large file is a fresh mapping
    whose every page faults in. Stops at ``size`` + 1 bytes: enough to see that the file grew."""
    if not _CHUNK_BUFFER:
        _CHUNK_BUFFER.append(memoryview(bytearray(CHUNK)))
    buffer = _CHUNK_BUFFER[0]
    length = 0
    while True:
        want = min(CHUNK, size + 1 - length)
        if want <= 0:
            return
        got = os.readv(fd, [buffer[:want]])
        if not got:
            return
        yield buffer[:got]
        length += got
        if got < want and length == size:  # the end, where it was listed to be
            return


def _hash_chunks(fd, st, algo):
    """(hex digest, bytes read) of fd, read in pieces (``_pieces``)."""
    digest = _blob_digest(st.st_size) if algo is None else _hashlib().new(algo)
    length = 0
    for piece in _pieces(fd, st.st_size):
        digest.update(piece)
        length += len(piece)
    return digest.hexdigest(), length


def _stable_key(st):
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _stream_file(where, head, emit, send_piece):
    """Send a large regular file in pieces, never held whole (the agent stays within ~50 MiB
    whatever its size). A STREAMED record: its size (as fstat says when opened), then
    pieces, each a 4-byte length and that many bytes, a zero length, and one byte: SAME when
    the file stayed the same while read (inode, size, times), CHANGED when it changed: the
    client discards what it received and another record for the same path follows (it is
    read again, at most 5 times: then an UNREADABLE record says it keeps changing). A file whose
    ctime is under SETTLE_NS old is read only once it stayed the same that long (it may be
    half-way through a rewrite). ``head``: the record's path part; ``emit``: bytes into
    the stream; ``send_piece``: a piece (a view of a reused buffer) into the stream."""
    for _ in range(5):
        try:
            fd = open_file_at(where)  # os.read: no buffered file object
        except (FileNotFoundError, NotADirectoryError):
            emit(head + struct.pack(">BQ", Record.GONE, 0))  # vanished (since a previous try too)
            return
        try:
            st = os.fstat(fd)
            quiet = time.time_ns() - st.st_ctime_ns
            if quiet < SETTLE_NS:
                time.sleep((SETTLE_NS - quiet) / 1e9)
                settled = os.fstat(fd)
                if _stable_key(settled) != _stable_key(st):
                    continue  # still being written: look again
            emit(head + struct.pack(">BQ", Record.STREAMED, st.st_size))
            length = 0
            try:
                for piece in _pieces(fd, st.st_size):
                    if length == 0:
                        _pause_streaming()
                    length += len(piece)
                    send_piece(piece)
            except OSError as exc:  # a read error half-way (EIO): end the record in step
                emit(struct.pack(">IB", 0, Record.CHANGED) + head + _unreadable("%s: %s" % (where, exc.strerror or exc)))
                return
            same = _stable_key(os.fstat(fd)) == _stable_key(st) and length == st.st_size
            emit(struct.pack(">IB", 0, Record.SAME if same else Record.CHANGED))
            if same:
                return
        finally:
            os.close(fd)
    emit(head + _unreadable("%s: keeps changing while read" % where))


def _unreadable(reason):
    data = reason.encode("utf-8", "replace")
    return struct.pack(">BQ", Record.UNREADABLE, len(data)) + data


def _pause_streaming(count=[0]):
    """A test hook: with SNAPVER_TEST_STREAMED_HOOK=DIR, once the first piece of a streamed
    file is read (the rest not yet), write DIR/streamed-N and wait (at most 60 s) for
    DIR/go-N: a test changes the file in between."""
    folder = os.environ.get("SNAPVER_TEST_STREAMED_HOOK")
    if not folder:
        return
    count[0] += 1
    with open(os.path.join(folder, "streamed-%d" % count[0]), "w"):
        pass
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(folder, "go-%d" % count[0])) and time.time() < deadline:
        time.sleep(0.01)


def walk(tree, tracked_paths, patterns):
    """Yield (relpath, stat, dir_fd, name) for every file, symlink and special file below
    the tracked paths, walking folders by descriptor (a folder swapped for a link mid-walk
    fails the listing instead of being followed). The folder ``dir_fd`` stays open until
    the next item is asked for: ``At(dir_fd, name, ...)`` reaches the item meanwhile (made
    only for the items read: an unchanged listing of 12,016 files needs none)."""
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
    return cache if isinstance(cache, (str, dict)) else {}


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
            if _blake2b(text.encode("utf-8", "surrogatepass")).hexdigest() == self.digest:
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
    own record is among them (12,016 files: decoded in 3 ms, not 16 ms as a JSON object).
    With ``cache_frame``, the cache comes in the frame after the request, zlib-compressed.
    With ``records_digest`` and ``records`` too (the BLAKE2b of the records, sorted, as one
    string, and how many), the frame is decoded only if the files' own records are not as
    many or, sorted, hash otherwise (``_Records``): a tree found as it was costs no
    decompressing, parsing or set of 12,016 records.
    """
    site = site_packages_of(request.get("site_packages"))
    cache = request.get("cache") or {}
    delta = bool(request.get("delta"))
    records = None
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
                    kind, size, st, oid, target = _row_of(where, st, want_oids, _WROTE.get(rel))
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
            # Some record is not the client's: each file taken as unchanged is looked up in
            # the decoded records now, and one that is not there is listed as the loop would
            # have (reached by its path: no folder on the way may be a link).
            vanished = set()
            for record in records.taken:
                if record in records:
                    continue
                same -= 1
                rel = record.split("\0", 1)[0]
                try:
                    where = at_path(tree, rel)
                    st = lstat_at(where)
                    if S_ISDIR(st.st_mode):  # a folder where the walk found a file: listed by neither
                        raise AgentError("%s: changed while listed (a file swapped for a folder)"
                                         % tree.full(rel), "remote")
                    kind, size, st, oid, target = _row_of(where, st, want_oids, _WROTE.get(rel))
                except FileNotFoundError:
                    vanished.add(rel)  # gone since walked: not listed
                    continue
                except Unsafe as exc:
                    raise AgentError("%s (changed while listed)" % exc.through(rel), "remote")
                except PermissionError:
                    raise AgentError("%s: permission denied" % tree.full(rel), "path")
                hashed += kind == "f" and oid is not None
                entries.append(_listing_row(rel, kind, size, st, oid, target))
            if vanished:
                listed = [rel for rel in listed if rel not in vanished]
    finally:
        tree.close()
    channel.listed = listed  # for a read of "listed" paths
    reply = {"now_ns": now_ns, "entries": entries, "hashed": hashed}
    if delta:
        reply["same"] = same
        if records is not None and same == len(records):  # each record found (once: paths are unique)
            reply["gone"] = []
        elif records is not None:
            present = set(listed)
            reply["gone"] = sorted(path for path in (record.split("\0", 1)[0] for record in records)
                                   if path not in present)
        elif in_cache == len(cache):
            reply["gone"] = []
        else:
            present = set(listed)
            reply["gone"] = [path for path in cache if path not in present]
    channel.send(reply)


def op_read(channel, request):
    """Stream the content of the asked paths, in one (optionally zlib) stream.

    Records (see ``Record`` for their kinds): path length (4) + path + kind (1) + size (8)
    + content. A file above BIG_FILE is a STREAMED record instead, its content
    in pieces and checked after they are sent (``_stream_file``), so neither side holds it
    whole. A zero path length ends the stream. (An error reply in the middle of the
    stream would put it out of step.) A path whose folder became a symlink since it was
    listed is unreadable, never followed.
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

    def send_piece(piece):
        if compressor is not None:
            emit(struct.pack(">I", len(piece)))
            emit(piece)
        else:  # its own frame, straight from the reused buffer
            flush_pending()
            channel.send_frame_parts(struct.pack(">I", len(piece)), piece)

    paths = channel.listed if request.get("listed") else request["paths"]
    channel.send({"ok": True})
    tree = Tree(site)
    try:
        for rel in paths:
            encoded = fs(rel)
            head = struct.pack(">I", len(encoded)) + encoded
            try:
                where = at_path(tree, rel)
                st = lstat_at(where)
                if stat.S_ISLNK(st.st_mode):
                    kind, data = Record.LINK, fs(readlink_at(where))
                elif stat.S_ISREG(st.st_mode):
                    kind = Record.FILE
                    try:
                        data, st = read_stable(where, st)
                    except TooBig:
                        _stream_file(where, head, emit, send_piece)
                        continue
                else:
                    kind, data = Record.SPECIAL, special_text(st)
            except (FileNotFoundError, NotADirectoryError):
                kind, data = Record.GONE, b""
            except (AgentError, OSError) as exc:
                emit(head + _unreadable(str(exc)))
                continue
            emit(head + struct.pack(">BQ", kind, len(data)))
            emit(data)
            del data  # a large one is not held while the next is read
    finally:
        tree.close()
    emit(struct.pack(">I", 0))
    if compressor is not None:
        tail = compressor.flush()
        if tail:
            pending.append(tail)
    flush_pending()
    channel.send_frame(b"")
    channel.flush()


def op_hash(channel, request):
    """Hash the asked paths with a hashlib algorithm (sha256 for RECORD checks); None for a
    path that is absent, a special file, or below a symlink."""
    site = site_packages_of(request.get("site_packages"))
    algo = request.get("algo", "sha256")
    result = {}
    tree = Tree(site)
    try:
        for rel in request["paths"]:
            result[rel] = None
            try:
                where = at_path(tree, rel)
                st = lstat_at(where)
            except (FileNotFoundError, NotADirectoryError, Unsafe):
                continue
            if stat.S_ISLNK(st.st_mode):
                result[rel] = _hashlib().new(algo, fs(readlink_at(where))).hexdigest()
            elif stat.S_ISREG(st.st_mode):
                result[rel] = hash_stable(where, st, algo)[0]
    finally:
        tree.close()
    channel.send({"hashes": result})


# -- writing (push and rollback) ---------------------------------------------------------
# A write holds the node's write lock (flock on each tracked root it touches: two snapver
# writers, from any store, never interleave), checks every path against what the client
# expects, stages each new file as a temporary file in its own folder (streamed to disk in
# pieces, its blob id checked), and only then commits: right before each rename the path
# is checked again (compare-and-swap: the same inode and times as when it was hashed, or the
# same content), and its folder must still be the one the file was staged in. Nothing is
# followed through a symlink. Renaming over the old file, never writing into it, matters
# too: uv hard-links a venv's files into a shared cache.

ABORT_FRAME = 0xFFFFFFFF  # a stream's length word that abandons the write: nothing is committed
LOCK_TIMEOUT = 60.0
_WRITE_RESULT = {}
# Blob id of every file this agent wrote (by path): hashed again right after, to verify the
# write and for the snapshot that follows, such a file need not settle (hash_stable).
_WROTE = {}


class Aborted(Exception):
    """The client abandoned the write (its user pressed Ctrl-C)."""


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
    digest = _blob_digest(target.size)
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
                    _WROTE[target.rel] = target.oid
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
              "skipped": {}, "aborted": False}
    _WRITE_RESULT.clear()
    _WRITE_RESULT.update(result)
    tree = Tree(site)
    held = []
    targets = []
    made = []
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
    for found, expect in ((result["written"], _WROTE), (result["deleted"], {})):
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
    # The output is read by a thread and the command's end is what is waited for, not the
    # pipe's: a restart that starts a server in the background (`nohup server &`) leaves
    # it holding the pipe open for as long as it runs.
    import threading

    pieces = []

    def pump(fd=process.stdout.fileno()):
        try:
            for piece in iter(lambda: os.read(fd, 65536), b""):
                pieces.append(piece)
        except OSError:
            pass

    reader = threading.Thread(target=pump)
    reader.daemon = True
    reader.start()
    timed_out = False
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(process.pid, 9)
        except OSError:
            pass
        process.wait()
    reader.join(1.0)  # what the command itself printed has arrived by now
    output = b"".join(pieces)
    channel.send({"code": process.returncode, "timed_out": timed_out,
                  "output": output[-4000:].decode("utf-8", "replace")})


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


# -- processes that run the tracked code (`snapver ps`) ----------------------------------
# Read from /proc only (no psutil on a node). A process is one of ours when it maps a file
# of the tracked tree (an extension module), or is a Python that can import the tree: the
# interpreter of the prefix that owns site-packages, or one with site-packages on its
# PYTHONPATH or as its working folder.
# A whole word of an option or variable name: `--tokenizer-path` is no secret, `HF_TOKEN` is.
_SECRET_WORD = re.compile(r"(^|[-_.])(tokens?|secret|password|passwd|credentials?|apikey|api[-_]key|"
                          r"access[-_]key|private[-_]key|auth)($|[-_.])", re.I)
_OWNER_LAYOUT = re.compile(r"^(/.*)/lib(?:64)?/python3(?:\.\d+)?/(?:site|dist)-packages/?$")
PS_FILES_SHOWN = 50  # changed files named per process (the rest counted)
PS_UNREADABLE_SHOWN = 50


def mask_command(argv):
    """The command line with secret-looking values masked: ``--api-key X``, ``--token=X``,
    ``HF_TOKEN=X``, ``--password X``. Masked here, so the secret never leaves the node."""
    shown, mask_next = [], False
    for token in argv:
        if mask_next:
            shown.append("***")
            mask_next = False
            continue
        name, eq, value = token.partition("=")
        if eq and value and _SECRET_WORD.search(name.lstrip("-")):
            shown.append(name + "=***")
        elif token.startswith("-") and not eq and _SECRET_WORD.search(token.lstrip("-")):
            shown.append(token)
            mask_next = True
        else:
            shown.append(token)
    return " ".join(shown)


def _proc_text(pid, name):
    with open("/proc/%d/%s" % (pid, name), "rb") as handle:
        return handle.read()


def _stat_fields(pid):
    """(comm, ppid, starttime in clock ticks) from /proc/PID/stat (readable by everyone)."""
    data = _proc_text(pid, "stat").decode("utf-8", "replace")
    comm = data[data.index("(") + 1:data.rindex(")")]
    rest = data[data.rindex(")") + 2:].split()
    return comm, int(rest[1]), int(rest[19])  # fields 4 and 22 of proc(5)


def _uid_of(pid):
    for line in _proc_text(pid, "status").decode("utf-8", "replace").splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    return -1


def _user_name(uid, names={}):
    if uid not in names:
        try:
            import pwd

            names[uid] = pwd.getpwuid(uid).pw_name
        except (ImportError, KeyError):
            names[uid] = str(uid)
    return names[uid]


def _boot_time():
    """The boot time in seconds since the epoch, from /proc/uptime (1/100 s, where
    /proc/stat btime is whole seconds): start times are compared with file ctimes."""
    with open("/proc/uptime") as handle:
        uptime = float(handle.read().split()[0])
    return time.time() - uptime


def _hidepid():
    """The hidepid option /proc is mounted with ("" when none)."""
    try:
        with open("/proc/mounts") as handle:
            return hidepid_of(handle.read())
    except OSError:
        return ""


def hidepid_of(mounts):
    """The hidepid option of the proc mount on /proc in ``mounts`` (the text of
    /proc/mounts; "" when none). The last mount on /proc is the one in effect (a proc
    mounted over another, as in a container)."""
    found = ""
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[1] == "/proc" and parts[2] == "proc":
            found = ""
            for option in parts[3].split(","):
                if option.startswith("hidepid=") and option not in ("hidepid=0", "hidepid=off"):
                    found = option
    return found


def _own_lineage():
    """This agent and its ancestors (the SSH session's shell): never listed."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = _stat_fields(pid)[1]
        except (OSError, ValueError, IndexError):
            break
    return pids


def _argv0_path(argv0, cwd, environ):
    """Where argv[0] points, without resolving symlinks (a venv's bin/python is one)."""
    if "/" in argv0:
        return os.path.normpath(os.path.join(cwd or "/", argv0))
    for folder in (environ.get(b"PATH") or b"").decode("utf-8", "replace").split(":"):
        candidate = os.path.join(folder or ".", argv0)
        if os.path.isfile(candidate):
            return os.path.normpath(os.path.join(cwd or "/", candidate))
    return argv0


def _environ(pid):
    found = {}
    for item in _proc_text(pid, "environ").split(b"\0"):
        key, eq, value = item.partition(b"=")
        if eq:
            found[key] = value
    return found


def _inspect(pid, site, roots, owner, owner_exes):
    """One process: None when it does not run the tree, else its row (reasons, mapped
    files). PermissionError/FileNotFoundError escape to the caller."""
    raw = _proc_text(pid, "cmdline")
    if not raw:
        return None  # a kernel thread, or a zombie
    argv = [part.decode("utf-8", "replace") for part in raw.rstrip(b"\0").split(b"\0")]
    comm, _, ticks = _stat_fields(pid)
    reasons, mapped = [], {}
    for line in _proc_text(pid, "maps").decode("utf-8", "surrogateescape").splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6:
            continue
        path = parts[5]
        deleted = path.endswith(" (deleted)")
        if deleted:
            path = path[: -len(" (deleted)")]
        rel = path[len(site) + 1:] if path.startswith(site + "/") else None
        if rel is not None and any(rel == r or rel.startswith(r + "/") for r in roots):
            mapped[rel] = (int(parts[4]), deleted)
    if mapped:
        reasons.append("maps %d file(s) of the tree" % len(mapped))
    exe = ""
    try:
        exe = os.readlink("/proc/%d/exe" % pid)
    except FileNotFoundError:
        pass
    if os.path.basename(exe).startswith("python") or os.path.basename(argv[0]).startswith("python"):
        cwd = os.readlink("/proc/%d/cwd" % pid)
        environ = _environ(pid)
        argv0 = _argv0_path(argv[0], cwd, environ)
        if owner and (argv0.startswith(owner + "/bin/")
                      or environ.get(b"VIRTUAL_ENV", b"").decode("utf-8", "replace") == owner):
            reasons.append("the deployment's python (%s)" % owner)
        elif exe and exe in owner_exes:
            reasons.append("the deployment's python (%s)" % exe)
        pythonpath = environ.get(b"PYTHONPATH", b"").decode("utf-8", "replace").split(":")
        if site in [os.path.normpath(os.path.join(cwd, p)) for p in pythonpath if p]:
            reasons.append("site-packages on its PYTHONPATH")
        if cwd == site:
            reasons.append("works in site-packages")
    if not reasons:
        return None
    return {"pid": pid, "comm": comm, "argv": argv, "ticks": ticks, "reasons": reasons, "mapped": mapped}


def op_ps(channel, request):
    """The processes that run code of the tracked tree, each with the tracked files
    changed (ctime) since it started: a mapped file replaced since is certain, a
    ``.py`` (or extension module) changed since "may run old code". Processes that
    cannot be read are counted and named, never skipped."""
    site = os.path.realpath(site_packages_of(request.get("site_packages")))
    roots = [p.strip("/") for p in request["paths"]]
    match = _OWNER_LAYOUT.match(site)
    owner = match.group(1) if match else ""
    owner_exes = set()
    if owner and not os.path.exists(os.path.join(owner, "pyvenv.cfg")):
        # Not a venv: the interpreter binary itself is the owner's (a venv's links
        # point to a base Python that other environments share).
        for name in os.listdir(os.path.join(owner, "bin")) if os.path.isdir(os.path.join(owner, "bin")) else []:
            if name.startswith("python"):
                owner_exes.add(os.path.realpath(os.path.join(owner, "bin", name)))
    ticks_per_second = os.sysconf("SC_CLK_TCK")
    boot = _boot_time()
    skip = _own_lineage()
    found, unreadable, scanned = [], [], 0
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        pid = int(name)
        scanned += 1
        try:
            row = _inspect(pid, site, roots, owner, owner_exes)
            if row is None:
                continue
            uid = _uid_of(pid)
        except FileNotFoundError:
            continue  # it ended while looked at
        except (PermissionError, ProcessLookupError) as exc:
            try:
                comm = _stat_fields(pid)[0]
            except (OSError, ValueError, IndexError):
                comm = "?"
            unreadable.append([pid, comm, exc.strerror or str(exc)])
            continue
        row["uid"], row["user"] = uid, _user_name(uid)
        row["started_ns"] = int((boot + row.pop("ticks") / float(ticks_per_second)) * 1e9)
        found.append(row)
    # Only files changed after the oldest process started can matter: one stat walk.
    changed = []
    if found:
        oldest = min(row["started_ns"] for row in found)
        tree = Tree(site)
        try:
            for rel, st, _, _ in walk(tree, roots, request.get("exclude") or []):
                if stat.S_ISREG(st.st_mode) and st.st_ctime_ns > oldest and rel.endswith((".py", ".so", ".pyd")):
                    changed.append((st.st_ctime_ns, rel))
        except AgentError:
            pass  # a tree that cannot be walked: the mapped files still speak
        finally:
            tree.close()
        changed.sort()
    processes = []
    for row in found:
        files = []
        for rel, (inode, deleted) in sorted(row["mapped"].items()):
            try:
                now = os.lstat(os.path.join(site, rel))
                replaced = deleted or now.st_ino != inode
            except OSError:
                replaced = True
            if replaced:
                files.append({"path": rel, "certain": True, "why": "mapped, replaced since it started"})
        certain = set(item["path"] for item in files)
        for ctime_ns, rel in changed:
            if ctime_ns > row["started_ns"] and rel not in certain:
                files.append({"path": rel, "certain": False, "why": "changed after it started: may run old code",
                              "changed_ns": ctime_ns})
        processes.append({"pid": row["pid"], "user": row["user"], "uid": row["uid"],
                          "command": mask_command(row["argv"]), "comm": row["comm"],
                          "started_ns": row["started_ns"], "reasons": row["reasons"],
                          "mapped": sorted(row["mapped"]), "restart_needed": bool(files),
                          "certain": any(item["certain"] for item in files),
                          "files": files[:PS_FILES_SHOWN], "files_more": max(0, len(files) - PS_FILES_SHOWN)})
    processes.sort(key=lambda item: item["pid"])
    unreadable.sort()
    channel.send({"processes": processes, "scanned": scanned, "unreadable": len(unreadable),
                  "unreadable_named": unreadable[:PS_UNREADABLE_SHOWN], "hidepid": _hidepid(),
                  "now_ns": time.time_ns()})


class ClientGone(Exception):
    """The client closed the agent's stdin or stdout (it ended, or dropped the session)."""


def client_gone(channel):
    """True once the client closed our stdin or stdout: a long wait on its behalf stops."""
    import select

    poller = select.poll()
    try:
        for stream in (channel.rfile, channel.wfile):
            poller.register(stream.fileno(), 0)  # hang-ups and errors are reported whatever is asked
    except (AttributeError, OSError, ValueError):
        return False  # not a file (an in-process channel)
    return any(events & (select.POLLHUP | select.POLLERR | select.POLLNVAL) for _, events in poller.poll(0))


class TooLong(Exception):
    """A call ran out of its time (``within``)."""


def within(seconds, call):
    """``call()``, stopped with TooLong after ``seconds`` whatever it waits on: a socket
    timeout bounds each read, and a server that sends a byte now and then never meets it."""
    import signal

    def expire(signum, frame):
        raise TooLong()

    try:
        previous = signal.signal(signal.SIGALRM, expire)
    except ValueError:  # not the main thread: no alarm to be had
        return call()
    try:
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            return call()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    finally:
        signal.signal(signal.SIGALRM, previous)


def _health_opener():
    """An opener with no proxy (a health URL is the node's own server) that follows no
    redirect: a 3xx is the answer, not another server's 200."""
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    return urllib.request.build_opener(urllib.request.ProxyHandler({}), NoRedirect())


def _health_attempt(opener, url, wait):
    """One GET of ``url``, the whole of it within ``wait`` seconds: ``(status, body)``, or
    ``(None, what it met)``."""
    import socket
    import urllib.error

    def get():
        with opener.open(url, timeout=wait) as reply:
            return reply.status, reply.read(200).decode("utf-8", "replace")

    try:
        return within(wait, get)
    except urllib.error.HTTPError as exc:
        if 300 <= exc.code < 400:
            return None, "answered %d %s (a redirect to %s, not followed)" % (
                exc.code, exc.reason, exc.headers.get("Location") or "nowhere")
        return None, "answered %d %s" % (exc.code, exc.reason)
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, (socket.timeout, TimeoutError)):
            return None, "no answer within %.1f s" % wait
        return None, getattr(reason, "strerror", None) or str(reason)
    except (socket.timeout, TimeoutError):
        return None, "no answer within %.1f s" % wait
    except TooLong:
        return None, "no answer within %.1f s (or only part of one)" % wait
    except (OSError, ValueError) as exc:
        return None, str(exc)


def op_health_url(channel, request):
    """Poll ``url`` from the node itself until it answers 2xx or ``timeout`` seconds pass,
    each attempt bounded whole. Replies whether it became healthy, and else what the last
    attempt met (refused, an HTTP status, a redirect, no answer). Stops if the client goes."""
    url = request["url"]
    began = time.monotonic()
    deadline = began + float(request.get("timeout") or 60)
    opener = _health_opener()
    attempts, last = 0, "never tried"
    while True:
        attempts += 1
        wait = max(0.2, min(5.0, deadline - time.monotonic()))
        code, said = _health_attempt(opener, url, wait)
        if code is not None and 200 <= code < 300:
            channel.send({"ok": True, "status": code, "attempts": attempts, "body": said,
                          "seconds": time.monotonic() - began})
            return
        last = said if code is None else "answered %d" % code
        if time.monotonic() + 0.2 >= deadline:
            break
        if client_gone(channel):
            raise ClientGone()
        time.sleep(0.2)
    channel.send({"ok": False, "last": last, "attempts": attempts, "seconds": time.monotonic() - began})


def op_ping(channel, request):
    channel.send({"pong": True})


OPS = {"ping": op_ping, "hello": op_hello, "list": op_list, "read": op_read, "hash": op_hash,
       "check": op_check, "write": op_write, "write_done": op_write_done, "run": op_run,
       "compile": op_compile, "ps": op_ps, "health_url": op_health_url}


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
        except ClientGone:
            return
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
    channel = Channel(sys.stdin.buffer, sys.stdout.buffer)
    channel.wfile.write(GREETING)
    channel.flush()
    serve(channel)
    try:
        sys.stdout.flush()
    except OSError:  # the client is gone
        pass
    os._exit(0)


if __name__ == "__main__" or __name__ == "snapver_agent":
    main()
