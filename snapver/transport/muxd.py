"""The mux daemon: holds one node's SSH connection and serves channels on it to snapver
commands through a Unix socket (the protocol: see ``mux.py``), with a warm spare.

Started by ``mux.start_mux`` as ``python -m snapver.transport.mux SOCKET IDLE``; it exits
after IDLE seconds without a client, or when its SSH connection drops.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

from snapver.config import NodeSpec

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
            except TimeoutError:
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
