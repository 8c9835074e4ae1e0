"""The node-side agent: sent as source to the node's own Python and run from stdin.

Standard library only, Python 3.8+. It never writes unless asked to by a write op, and
never follows symlinks. Protocol (both directions): a frame is a 4-byte big-endian
length and that many bytes; a request or reply is one frame of JSON; a stream is a
run of frames ended by an empty one. A request or reply of more than SQUEEZE_OVER
bytes travels zlib-compressed, its length word marked by the top bit (a listing's JSON
shrinks several times). Paths travel as JSON strings decoded
with ``surrogateescape`` (``ensure_ascii`` keeps lone surrogates intact).

It ships as one script assembled from this package's parts (``assemble``); this first
part holds what both ends share: frames, record kinds, errors and content ids.
"""

import json
import os
import struct
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


def hashlib_module():
    # Imported when first needed: loading OpenSSL is a few ms of every agent's start, and an
    # unchanged re-pull, or the node that streams a first pull, hashes nothing.
    import hashlib

    return hashlib


def blake2b_256(data):
    # CPython's own BLAKE2 module, not hashlib: an unchanged re-pull hashes nothing else,
    # and hashlib's import loads OpenSSL, far slower to import than _blake2.
    try:
        from _blake2 import blake2b
    except ImportError:
        return hashlib_module().blake2b(data, digest_size=32)
    return blake2b(data, digest_size=32)


def _sha1():
    try:
        return hashlib_module().sha1(usedforsecurity=False)
    except TypeError:  # Python < 3.9
        return hashlib_module().sha1()


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


def blob_digest(size):
    """A sha1 fed git's blob header: feed it the content for the blob id."""
    digest = _sha1()
    digest.update(b"blob %d\0" % size)
    return digest


def blob_id(data):
    digest = blob_digest(len(data))
    digest.update(data)
    return digest.hexdigest()


ABORT_FRAME = 0xFFFFFFFF  # a stream's length word that abandons the write: nothing is committed


class Aborted(Exception):
    """The client abandoned the write (its user pressed Ctrl-C)."""
