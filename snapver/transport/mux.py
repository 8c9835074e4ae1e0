"""A persistent SSH connection shared by successive snapver commands (like ControlPersist).

With ``control_persist = N`` (seconds) on a node, the first command starts a small
background process that holds the SSH connection and listens on a Unix socket in a
private folder; later commands send their agent command line through the socket and
get a fresh SSH channel on the held connection: no TCP, key exchange, authentication
or ``import paramiko`` per command. The process exits after N idle seconds, or when
its SSH connection drops.

It also keeps a warm spare (see ``Spare``): when it hands out a channel for a command
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
import threading
import time
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
_NOT_FOR_THE_CONNECTION = ("restart", "health", "health_url", "health_timeout")


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

        return RawChannel(stdin, stream, close, kill=kill)  # type: ignore[arg-type]

    def _disconnect(self) -> None:
        if self._direct is not None:
            self._direct._disconnect()


# -- server side (python -m snapver.transport.mux SOCKET IDLE) ----------------------
SPARE_MAX_AGE = 300.0  # seconds; an older spare is replaced, not handed out (see Spare)
SPARE_WAIT = 10.0  # seconds a client waits at most for a spare still being opened


def _open_channel(ssh_transport: Any, command: str) -> Any:
    """A new SSH channel on the held connection, running ``command``."""
    from snapver.transport.ssh import MAX_PACKET, WINDOW_SIZE

    channel = ssh_transport.open_session(window_size=WINDOW_SIZE, max_packet_size=MAX_PACKET)
    channel.exec_command(command)
    return channel


def _discard(channel: Any) -> None:
    """Close a channel nobody uses: its process on the node reads end-of-file on stdin."""
    try:
        channel.close()
    except Exception:  # noqa: BLE001 - the connection may already be gone, and the process with it
        pass


class Spare:
    """A warm spare: one channel opened in advance for the command line last asked for.

    Starting a command on a node costs more than the channel: sshd runs it through the
    user's login shell (rc files, a pyenv shim), then Python starts. The spare has done
    all that and sits blocked reading its stdin; the next client asking for the same
    command line, byte for byte, gets it and just sends its input. At most one spare per
    mux, handed to one client only (``take`` empties the slot under the lock); a client
    that comes while the spare is still being opened waits for it (it is further along
    than a new channel would be). A spare whose process has ended (killed, exited) is
    closed and the client gets a fresh channel. A spare older than SPARE_MAX_AGE is
    replaced too: its process holds the node's environment, interpreter and shell rc of
    the moment it started, and a reinstalled Python or a changed pyenv version should be
    seen within minutes. (Each hand-out opens a new spare, so with control_persist <=
    SPARE_MAX_AGE the age limit never fires: the mux exits first.)
    """

    def __init__(self, ssh_transport: Any) -> None:
        self.ssh = ssh_transport
        self.ready = threading.Condition()
        self.channel: Any = None
        self.command = ""  # the command line of the spare held or being opened
        self.born = 0.0
        self.filling = False
        self.closed = False

    def take(self, command: str) -> Any:
        """The spare's channel if it runs exactly ``command`` and still lives, else None."""
        with self.ready:
            if self.command == command:
                self.ready.wait_for(lambda: not self.filling, timeout=SPARE_WAIT)
            channel, self.channel = self.channel, None
            fits = self.command == command and time.monotonic() - self.born < SPARE_MAX_AGE
        if channel is None:
            return None
        if not fits or channel.exit_status_ready() or channel.eof_received:
            _discard(channel)
            return None
        return channel

    def fill(self, command: str) -> None:
        """Open the spare for ``command`` unless one is there or being opened."""
        with self.ready:
            if self.closed or self.filling or self.channel is not None:
                return
            self.filling, self.command = True, command
        channel = None
        try:
            channel = _open_channel(self.ssh, command)
        except Exception:  # noqa: BLE001 - no spare then; the next client's own channel reports the trouble
            pass
        with self.ready:
            self.filling = False
            if channel is not None and not self.closed:
                self.channel, self.born = channel, time.monotonic()
                channel = None
            self.ready.notify_all()
        if channel is not None:
            _discard(channel)

    def close(self) -> None:
        """No more spares: close the one there (its node process ends)."""
        with self.ready:
            self.closed = True
            channel, self.channel = self.channel, None
        if channel is not None:
            _discard(channel)


class _State:
    """What the serving threads share: the connection, the spare, the clients being served."""

    def __init__(self, ssh_transport: Any) -> None:
        self.ssh = ssh_transport
        self.spare = Spare(ssh_transport)
        self.lock = threading.Lock()
        self.active = 0
        self.last = time.monotonic()
        self.broken = False

    def count(self, step: int) -> None:
        with self.lock:
            self.active += step
            self.last = time.monotonic()

    def idle_for(self) -> float:
        with self.lock:
            return 0.0 if self.active else time.monotonic() - self.last


def _send(sock: socket.socket, lock: threading.Lock, kind: bytes, data: bytes) -> None:
    with lock:
        sock.sendall(kind + struct.pack(">I", len(data)) + data)


def _serve_client(client: socket.socket, state: _State) -> None:
    lock = threading.Lock()
    state.count(+1)
    try:
        reader = client.makefile("rb")
        command = json.loads(reader.readline())["command"]
        channel = state.spare.take(command)
        if channel is None:
            try:
                channel = _open_channel(state.ssh, command)
            except Exception as exc:  # noqa: BLE001 - reported to the client, then we quit
                _send(client, lock, b"!", f"cannot open a channel: {exc}".encode())
                state.broken = True
                return
        _send(client, lock, b"o", b"")  # channel is open
        threading.Thread(target=state.spare.fill, args=(command,), daemon=True).start()

        def pump_in() -> None:
            try:
                while data := reader.read1(1 << 20):
                    channel.sendall(data)
            except OSError:
                pass
            finally:
                channel.shutdown_write()

        def pump_err() -> None:
            while data := channel.recv_stderr(1 << 16):
                _send(client, lock, b"e", data)

        threads = [threading.Thread(target=pump_in, daemon=True), threading.Thread(target=pump_err, daemon=True)]
        for thread in threads:
            thread.start()
        try:
            while data := channel.recv(1 << 20):
                _send(client, lock, b"o", data)
            threads[1].join(5)
            _send(client, lock, b"x", str(channel.recv_exit_status()).encode())
        except OSError:
            pass
        channel.close()
    finally:
        client.close()
        state.count(-1)


def serve(path: Path, idle_seconds: float) -> int:
    """Connect, report ``ok`` (or the error) on stdout, then serve until idle."""
    from snapver.errors import SnapverError
    from snapver.transport.ssh import SshTransport

    known = {f.name for f in dataclasses.fields(NodeSpec)}
    spec = NodeSpec(**{k: v for k, v in json.loads(sys.stdin.read()).items() if k in known})
    try:
        connection = SshTransport(spec)._connect()
    except SnapverError as exc:
        print(f"error {exc.exit_code} {exc}", flush=True)
        return 1
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    tmp = path.with_name(path.name + f".{os.getpid()}")
    server.bind(str(tmp))
    server.listen(16)
    os.replace(tmp, path)  # atomically take over a stale socket path
    path_inode = os.stat(path).st_ino
    server.settimeout(0.5)
    print("ok", flush=True)
    sys.stdout.close()
    state = _State(connection.transport)
    try:
        while not state.broken and connection.transport.is_active():
            try:
                client, _ = server.accept()
            except socket.timeout:
                if state.idle_for() > idle_seconds:
                    break
                continue
            threading.Thread(target=_serve_client, args=(client, state), daemon=True).start()
    finally:
        try:
            if os.stat(path).st_ino == path_inode:  # still ours, not a newer mux's
                path.unlink()
        except OSError:
            pass
        server.close()
        state.spare.close()
        connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]), float(sys.argv[2])))
