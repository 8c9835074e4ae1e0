"""A persistent SSH connection shared by successive snapver commands (like ControlPersist).

With ``control_persist = N`` (seconds) on a node, the first command starts a small
background process that holds the SSH connection and listens on a Unix socket in a
private folder; later commands send their agent command line through the socket and
get a fresh SSH channel on the held connection: no TCP, key exchange, authentication
or ``import paramiko`` per command. The process exits after N idle seconds, or when
its SSH connection drops.

It also keeps a warm spare (see ``muxd.Spare``): when it hands out a channel for a command
line, it opens one more channel running the same line, so the next command's process
on the node (login shell, Python) has already started when that command asks for it.

Socket protocol: the client sends one JSON line ``{"command": ...}`` then the
command's stdin; the server answers with frames ``type (1 byte) + length (4) + data``:
``o`` stdout, ``e`` stderr, ``x`` exit status (decimal text), ``!`` error (text).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from snapver.config import NodeSpec
from snapver.errors import TransportError
from snapver.transport.base import AgentTransport, RawChannel

MUX_VERSION = 1


def mux_dir() -> Path:
    """A folder only this user can enter (refused if someone else owns it)."""
    folder = Path(tempfile.gettempdir()) / f"snapver-mux-{os.getuid()}"
    folder.mkdir(mode=0o700, exist_ok=True)
    st = folder.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise TransportError(f"{folder} is not private to this user; not using a persistent connection")
    return folder


def socket_path(spec_fields: dict[str, Any]) -> Path:
    """One socket per distinct connection setting (host, port, user, keys, policy)."""
    key = json.dumps(spec_fields, sort_keys=True).encode()
    return mux_dir() / f"{hashlib.sha256(key).hexdigest()[:20]}.sock"


def spec_socket_path(spec: NodeSpec) -> Path:
    """The socket of the mux that serves ``spec``'s connection."""
    return socket_path({k: v for k, v in dataclasses.asdict(spec).items()
                        if k in ("host", "port", "user", "identity_file", "known_hosts", "host_key_policy")})


# -- client side ---------------------------------------------------------------------
class MuxStream:
    """The agent's stdout as a readable file, demultiplexed from the socket's frames."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.reader = sock.makefile("rb")
        self.buffer = bytearray()
        self.stderr = bytearray()
        self.exit_status: int | None = None
        self.eof = False

    def _frame(self) -> bool:
        head = self.reader.read(5)
        if len(head) < 5:
            self.eof = True
            return False
        kind, size = head[:1], struct.unpack(">I", head[1:])[0]
        data = self.reader.read(size)
        if kind == b"o":
            self.buffer += data
        elif kind == b"e":
            self.stderr += data
        elif kind == b"x":
            self.exit_status = int(data or b"-1")
            self.eof = True
            return False
        elif kind == b"!":
            self.stderr += data
            self.eof = True
            return False
        return True

    def read(self, size: int) -> bytes:
        while len(self.buffer) < size and not self.eof:
            self._frame()
        data = bytes(self.buffer[:size])
        del self.buffer[:size]
        return data


class MuxStdin:
    """The agent's stdin: plain writes on the socket; ``close`` half-closes it."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def write(self, data: bytes) -> int:
        self.sock.sendall(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def open_channel(path: Path, command: str) -> tuple[MuxStdin, MuxStream, socket.socket] | None:
    """Run ``command`` through the mux at ``path``; None if no mux answers there."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
        sock.sendall(json.dumps({"v": MUX_VERSION, "command": command}).encode() + b"\n")
    except OSError:
        sock.close()
        return None
    stream = MuxStream(sock)
    # The first frame tells whether the mux could open a channel at all.
    if not stream._frame() and stream.exit_status is None and not stream.buffer:
        sock.close()
        return None
    return MuxStdin(sock), stream, sock


def start_mux(path: Path, spec_json: dict[str, Any], idle_seconds: float, timeout: float) -> None:
    """Start the background process for ``path``; raise what its connection attempt raised."""
    process = subprocess.Popen(
        [sys.executable, "-m", "snapver.transport.mux", str(path), str(idle_seconds)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        start_new_session=True, close_fds=True)
    assert process.stdin and process.stdout
    process.stdin.write(json.dumps(spec_json).encode())
    process.stdin.close()
    line = process.stdout.readline().decode().strip()
    process.stdout.close()
    if line == "ok":
        return
    if line.startswith("error "):
        _, code, message = line.split(" ", 2)
        from snapver import errors

        kind = {3: errors.TransportError}.get(int(code), errors.TransportError)
        raise kind(message)
    raise TransportError(f"the persistent connection did not start ({line or 'no answer'})")


# What a node's hooks say (config.py): nothing the connection needs, so never sent to the
# background process (which may be another snapver's, started from the same python).
_NOT_FOR_THE_CONNECTION = ("restart", "health", "health_url", "health_timeout", "health_request")


def connection_fields(spec: NodeSpec) -> dict[str, Any]:
    """The spec as the background process needs it to connect."""
    return {k: v for k, v in dataclasses.asdict(spec).items() if k not in _NOT_FOR_THE_CONNECTION}


class MuxTransport(AgentTransport):
    """SSH through the node's persistent connection, started on first use.

    Falls back to a direct connection when the background process cannot serve, so a
    persistent connection can speed a command up but never make it fail.
    """

    def __init__(self, spec: NodeSpec) -> None:
        super().__init__(spec)
        self._direct: AgentTransport | None = None

    def _start(self, command: str) -> RawChannel:
        path = spec_socket_path(self.spec)
        opened = open_channel(path, command)
        if opened is None:
            start_mux(path, connection_fields(self.spec), self.spec.control_persist, self.spec.connect_timeout)
            opened = open_channel(path, command)
        if opened is None:
            from snapver.transport.ssh import SshTransport

            self._direct = SshTransport(self.spec)
            return self._direct._start(command)
        stdin, stream, sock = opened

        def close() -> str:
            stdin.close()
            sock.settimeout(5)
            try:
                while not stream.eof:
                    stream._frame()
            except OSError:
                pass
            sock.close()
            return stream.stderr.decode("utf-8", "replace")

        def kill() -> None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked reading it
            except OSError:
                pass

        return RawChannel(stdin, stream, close, kill=kill)

    def _disconnect(self) -> None:
        if self._direct is not None:
            self._direct._disconnect()


if __name__ == "__main__":  # the daemon's command line, as `ps` shows it: the daemon itself is muxd.py
    from snapver.transport.muxd import serve

    sys.exit(serve(Path(sys.argv[1]), float(sys.argv[2])))
