"""The node-side agent: sent as source to the node's own Python and run from stdin.

Standard library only, Python 3.8+. It never writes unless asked to by a write op, and
never follows symlinks. Protocol (both directions): a frame is a 4-byte big-endian
length and that many bytes; a request or reply is one frame of JSON; a stream is a
run of frames ended by an empty one. Paths travel as JSON strings decoded with
``surrogateescape`` (``ensure_ascii`` keeps lone surrogates intact).
"""

import fnmatch
import hashlib
import json
import os
import socket
import stat
import struct
import sys
import sysconfig
import time
import zlib

CHUNK = 1 << 20
PROTOCOL = 1


def _sha1():
    try:
        return hashlib.sha1(usedforsecurity=False)
    except TypeError:  # Python < 3.9
        return hashlib.sha1()


class Channel:
    """Framed messages over this process's stdin and stdout."""

    def __init__(self, rfile, wfile):
        self.rfile = rfile
        self.wfile = wfile

    def read_exact(self, size):
        data = self.rfile.read(size)
        if data is None or len(data) != size:
            raise EOFError("connection closed")
        return data

    def recv(self):
        (size,) = struct.unpack(">I", self.read_exact(4))
        return json.loads(self.read_exact(size).decode("utf-8")) if size else None

    def recv_frame(self):
        (size,) = struct.unpack(">I", self.read_exact(4))
        return self.read_exact(size) if size else b""

    def send(self, message):
        data = json.dumps(message, ensure_ascii=True, separators=(",", ":")).encode("ascii")
        self.wfile.write(struct.pack(">I", len(data)) + data)
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


def blob_id(data):
    digest = _sha1()
    digest.update(b"blob %d\0" % len(data))
    digest.update(data)
    return digest.hexdigest()


def excluded(name, relpath, is_dir, patterns):
    for pattern in patterns:
        if pattern.endswith("/"):
            if is_dir and _match(name, relpath, pattern[:-1]):
                return True
        elif _match(name, relpath, pattern):
            return True
    return False


def _match(name, relpath, pattern):
    if "/" in pattern:
        return fnmatch.fnmatchcase(relpath, pattern.lstrip("/"))
    return fnmatch.fnmatchcase(name, pattern)


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
    site = requested or sysconfig.get_paths()["purelib"]
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
        "hostname": socket.gethostname(),
        "python_version": "%d.%d.%d" % sys.version_info[:3],
        "python": sys.executable,
        "site_packages": site,
        "dists": find_dists(site, request.get("paths") or []),
    })


def read_stable(full, st):
    """Read a file and make sure it did not change while read; returns (data, stat)."""
    for _ in range(5):
        with open(full, "rb") as handle:
            data = handle.read()
            after = os.fstat(handle.fileno())
        if (after.st_size, after.st_mtime_ns, after.st_ctime_ns) == (len(data), st.st_mtime_ns, st.st_ctime_ns):
            return data, after
        st = after
    raise AgentError("%s: keeps changing while read" % full, "remote")


def walk(site, tracked_paths, patterns):
    """Yield (relpath, stat) for every file and symlink below the tracked paths."""
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
                    rel = reldir + "/" + entry.name
                    st = entry.stat(follow_symlinks=False)
                    is_dir = stat.S_ISDIR(st.st_mode)
                    if excluded(entry.name, rel, is_dir, patterns):
                        continue
                    if is_dir:
                        stack.append(rel)
                    elif stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode):
                        yield rel, st


def op_list(channel, request):
    """List the tree: kind, mode, size, times, inode, link target and git blob id.

    A file whose stat matches the client's cache keeps its cached blob id unless its
    times are too close to when that cache was made to be trusted (git's racy check).
    """
    site = site_packages_of(request.get("site_packages"))
    cache = request.get("cache") or {}
    racy_after = int(request.get("cache_time_ns") or 0) - 2 * 10**9
    want_oids = request.get("oids", True)
    now_ns = time.time_ns()
    entries = []
    hashed = 0
    for rel, st in walk(site, request["paths"], request.get("exclude") or []):
        full = os.path.join(site, rel)
        target = None
        oid = None
        if stat.S_ISLNK(st.st_mode):
            target = os.fsdecode(os.readlink(full))
            oid = blob_id(fs(target))
            size = len(fs(target))
        else:
            size = st.st_size
            cached = cache.get(rel)
            key = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino, st.st_mode]
            if cached and cached[:5] == key and max(st.st_mtime_ns, st.st_ctime_ns) < racy_after:
                oid = cached[5]
            elif want_oids:
                try:
                    data, st = read_stable(full, st)
                except FileNotFoundError:
                    continue
                except PermissionError:
                    raise AgentError("%s: permission denied" % full, "path")
                oid = blob_id(data)
                size = len(data)
                hashed += 1
        entries.append([rel, "l" if target is not None else "f", st.st_mode, size,
                        st.st_mtime_ns, st.st_ctime_ns, st.st_ino, oid, target])
    channel.send({"now_ns": now_ns, "entries": entries, "hashed": hashed})


def op_read(channel, request):
    """Stream the content of the asked paths, in one (optionally zlib) stream.

    Record: path length (4) + path + kind (1: file, 2: link, 0: vanished) + size (8) +
    content. A zero path length ends the stream.
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

    channel.send({"ok": True})
    for rel in request["paths"]:
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
            data = fs(os.readlink(full))
        elif stat.S_ISREG(st.st_mode):
            data, st = read_stable(full, st)
        else:
            result[rel] = None
            continue
        digest = hashlib.new(algo)
        digest.update(data)
        result[rel] = digest.hexdigest()
    channel.send({"hashes": result})


def op_ping(channel, request):
    channel.send({"pong": True})


OPS = {"ping": op_ping, "hello": op_hello, "list": op_list, "read": op_read, "hash": op_hash}


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
    serve(Channel(sys.stdin.buffer, sys.stdout.buffer))


if __name__ == "__main__" or __name__ == "snapver_agent":
    main()
