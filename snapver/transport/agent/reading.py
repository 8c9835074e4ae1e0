"""File content read whole only once it held still, hashed in pieces, streamed (``read``, ``hash``)."""

import os
import stat
import struct
import time
import zlib

from .fsat import Tree, Unsafe, at_path, lstat_at, open_file_at, readlink_at, site_packages_of, special_text
from .wire import BIG_FILE, CHUNK, AgentError, Record, blob_digest, fs, hashlib_module

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


_CHUNK_BUFFER = []  # type: list[memoryview]


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
    digest = blob_digest(st.st_size) if algo is None else hashlib_module().new(algo)
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
                emit(
                    struct.pack(">IB", 0, Record.CHANGED) + head + _unreadable("%s: %s" % (where, exc.strerror or exc))
                )
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


def _pause_streaming(count=[0]):  # noqa: B006 - a counter kept across calls on purpose
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
    result = {}  # type: dict[str, str | None]
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
                result[rel] = hashlib_module().new(algo, fs(readlink_at(where))).hexdigest()
            elif stat.S_ISREG(st.st_mode):
                result[rel] = hash_stable(where, st, algo)[0]
    finally:
        tree.close()
    channel.send({"hashes": result})
