"""A node over SSH, through Fabric; the only module that imports fabric or paramiko.

Fabric's Connection resolves ``~/.ssh/config`` (aliases, HostName, Port, User,
IdentityFile) but trusts every unknown host key; here host keys are checked as
OpenSSH does: known_hosts files are loaded, an unknown key is refused unless the
policy is ``accept-new`` (which records it), and a changed key is always refused.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from pathlib import Path
from typing import Any

from snapver.transport import deferred

deferred.defer("invoke.vendor.yaml")  # before paramiko and Fabric import Invoke

import paramiko
from fabric import Config, Connection
from paramiko.hostkeys import HostKeyEntry, InvalidHostKey

from snapver.config import NodeSpec
from snapver.errors import HostKeyError, TransportError
from snapver.transport.base import AgentTransport, RawChannel
from snapver.transport.chunks import ByteQueue
from snapver.transport.early import EarlyConnection

# paramiko logs a failed handshake with a traceback; with no handler configured Python
# would print it on stderr. The failure itself is raised and reported as one line.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# The window is what the node may send ahead of what we read (the client holds up to that
# much): enough for paramiko's decryption speed over a far link, small enough for memory
# (bench/README.md, "Figures behind the code"). Large packets cut paramiko's per-packet cost.
WINDOW_SIZE = 4 << 20
# The most taken from the channel's buffer at once: a bytes object of this size per
# receive, beside the channel's own buffer (larger ones cost memory, not CPU).
RECV_AT_ONCE = 1 << 20
MAX_PACKET = 256 << 10
# AES-GCM first: one pass instead of AES-CTR plus a separate HMAC.
FAST_CIPHERS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com")


def _fast_transport(sock: Any, **kwargs: Any) -> paramiko.Transport:
    """A paramiko Transport that prefers the cheapest ciphers the server also offers, on a
    socket that sends each message at once.

    paramiko writes every SSH message with a send of its own; with Nagle's algorithm a
    small message that follows one not yet acknowledged waits for that ACK, which the
    server delays by up to 40 ms. The handshake did that twice (key exchange, service
    request), and a third time the other way round (see _QuickAckSocket), on every
    connection, on loopback as on a far link.
    """
    transport = paramiko.Transport(_tuned(sock), **kwargs)
    options = transport.get_security_options()
    offered = tuple(options.ciphers)
    options.ciphers = tuple(c for c in FAST_CIPHERS if c in offered) + tuple(
        c for c in offered if c not in FAST_CIPHERS
    )
    return transport


class _QuickAckSocket(socket.socket):
    """A TCP socket that acknowledges what it receives at once (Linux's TCP_QUICKACK, set
    again after every read: the kernel drops back to delayed ACKs by itself).

    After authentication sshd sends two small messages that need no answer; its reply to
    our channel open, small too, then waits (Nagle) until we ACK them, which the kernel
    delays by up to 40 ms. paramiko reads whole SSH packets, so the extra call is one
    per packet read.
    """

    def recv(self, size: int, flags: int = 0) -> bytes:
        data = super().recv(size, flags)
        try:
            self.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
        except OSError:
            pass
        return data


def _tuned(sock: Any) -> Any:
    """``sock`` set to send each message at once and to ACK at once (TCP only)."""
    if not isinstance(sock, socket.socket) or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return sock  # a ProxyJump channel, a ProxyCommand pipe
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if not hasattr(socket, "TCP_QUICKACK"):
        return sock
    timeout = sock.gettimeout()
    tuned = _QuickAckSocket(sock.family, sock.type, sock.proto, fileno=sock.detach())
    tuned.settimeout(timeout)
    return tuned


# What paramiko raises when a server accepts TCP but stalls before the banner, or after
# it (the handshake timed out, and authentication then finds no session).
_HANDSHAKE_TIMEOUTS = ("Error reading SSH protocol banner", "No existing session")


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint of a host key."""
    return key.fingerprint if hasattr(key, "fingerprint") else key.get_base64()


def load_known_hosts(client: paramiko.SSHClient, files: list[Path]) -> set[tuple[str, str]]:
    """Load known_hosts files as OpenSSH reads them; returns the ``@revoked`` keys.

    paramiko's own loader stops with an exception at the first line it cannot read, and
    every marker line (``@cert-authority``, ``@revoked``) is one. Here bad lines are
    skipped, host-certificate authorities are ignored (no certificates are used), and a
    revoked key is never loaded as known: it reaches the missing-key policy, which refuses it.
    """
    revoked: set[tuple[str, str]] = set()
    entries = []
    for known in files:
        try:
            text = known.read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise HostKeyError(f"cannot read known_hosts {known}: {exc.strerror or exc}") from exc
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("@"):
                fields = line.split()
                if fields[0] == "@revoked" and len(fields) >= 4:
                    revoked.add((fields[2], fields[3]))
                continue
            try:
                entry = HostKeyEntry.from_line(line, number)
            except (paramiko.SSHException, InvalidHostKey, ValueError, TypeError):
                continue
            if entry is not None and entry.key is not None:
                entries.append(entry)
    keys = client.get_host_keys()
    for entry in entries:
        if (entry.key.get_name(), entry.key.get_base64()) not in revoked:
            for name in entry.hostnames:
                keys.add(name, entry.key.get_name(), entry.key)
    return revoked


def _refuse_revoked(revoked: set[tuple[str, str]], hostname: str, key: paramiko.PKey) -> None:
    if (key.get_name(), key.get_base64()) in revoked:
        raise HostKeyError(f"host key for {hostname} is REVOKED in known_hosts ({key.get_name()} {fingerprint(key)})",
                           hint="this key must not be trusted; ask whoever runs the node")


class _StrictPolicy(paramiko.MissingHostKeyPolicy):
    def __init__(self, revoked: set[tuple[str, str]]) -> None:
        self.revoked = revoked

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        _refuse_revoked(self.revoked, hostname, key)
        raise HostKeyError(
            f"host key for {hostname} is not known ({key.get_name()} {fingerprint(key)})",
            hint="add it to known_hosts (ssh-keyscan), or set host_key_policy = \"accept-new\"",
        )


class _AcceptNewPolicy(paramiko.MissingHostKeyPolicy):
    """OpenSSH's ``StrictHostKeyChecking=accept-new``: record unknown keys, never replace."""

    def __init__(self, known_hosts: Path, revoked: set[tuple[str, str]]) -> None:
        self.known_hosts = known_hosts
        self.revoked = revoked

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        _refuse_revoked(self.revoked, hostname, key)
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with open(self.known_hosts, "a", encoding="ascii") as handle:
            handle.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)


ALIVE_MISSES = 3  # unanswered keepalives in a row that end a connection (OpenSSH's ServerAliveCountMax)


def watch_link(transport: paramiko.Transport, interval: float) -> None:
    """OpenSSH's ServerAliveInterval for a paramiko transport: every ``interval`` seconds ask
    the server for a reply (any reply: sshd answers requests it does not know); after
    ALIVE_MISSES unanswered, close the connection. Reads and writes then fail at once, so a
    silent partition cannot hang a command — and the store lock it holds — forever.
    (paramiko's own keepalive wants no reply, so it cannot tell a dead link.)"""

    def ask(answered: threading.Event) -> None:
        try:
            transport.global_request("keepalive@openssh.com", wait=True)
        except Exception:  # noqa: BLE001 - a closing transport; the watcher sees it inactive
            pass
        answered.set()

    def watch() -> None:
        misses = 0
        while True:
            # The first ask waits too: one at once would be answered with a small packet
            # that holds back the server's next one (Nagle) until we ACK it, 40 ms later.
            if not misses:
                time.sleep(interval)
            if not transport.is_active():
                return
            answered = threading.Event()
            threading.Thread(target=ask, args=(answered,), daemon=True, name="snapver-keepalive").start()
            if answered.wait(interval):
                misses = 0
                continue
            misses += 1
            if misses >= ALIVE_MISSES:
                transport.close()
                return

    threading.Thread(target=watch, daemon=True, name="snapver-link-watch").start()


class _ChannelWriter:
    """The agent's stdin: writes go straight to the channel, and a dropped connection is an
    OSError like any broken pipe (paramiko raises EOFError). Unlike paramiko's own file
    object, it has no buffer to flush when garbage-collected after the connection died
    (that printed "Exception ignored … Traceback" on stderr)."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self.channel = channel

    def write(self, data: bytes) -> int:
        try:
            self.channel.sendall(data)
        except (EOFError, paramiko.SSHException) as exc:
            raise BrokenPipeError(str(exc) or "the connection closed") from exc
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        try:
            self.channel.shutdown_write()
        except (OSError, EOFError, paramiko.SSHException):
            pass


class _ChannelReader:
    """The agent's stdout: ``read(n)`` gives n bytes (fewer only at the end), taking what the
    channel holds at each receive, up to RECV_AT_ONCE or n. paramiko's file object asks the
    channel for only what is missing, and each such receive copies the rest of the
    channel's buffer (an ``array``) to its front: with megabytes in flight, megabytes
    moved per read."""

    def __init__(self, channel: paramiko.Channel) -> None:
        self.channel = channel
        self.received = ByteQueue()

    def read(self, size: int) -> bytes:
        while self.received.size < size:
            piece = self.channel.recv(max(size - self.received.size, RECV_AT_ONCE))
            if not piece:
                break
            self.received.put(piece)
        return self.received.take(size)


def _why_not_connected(exc: BaseException) -> str:
    """What failed, in words: paramiko wraps a refused connection as ``[Errno None] Unable
    to connect to port 22 on …``, holding each address's own error."""
    errors = getattr(exc, "errors", None)  # paramiko's NoValidConnectionsError
    if isinstance(errors, dict) and errors:
        exc = next(iter(errors.values()))
    reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return reason[:1].lower() + reason[1:]


class SshTransport(AgentTransport):
    """The agent runs in the node's Python, over one SSH connection."""

    def __init__(self, spec: NodeSpec, early: EarlyConnection | None = None) -> None:
        super().__init__(spec)
        self._connection: Connection | None = None
        self._early = early  # a TCP connection begun before paramiko was imported

    def _connect(self) -> Connection:
        spec = self.spec
        connect_kwargs: dict[str, Any] = {
            "banner_timeout": spec.connect_timeout,
            "auth_timeout": spec.connect_timeout,
            "transport_factory": _fast_transport,
        }
        if spec.identity_file:
            connect_kwargs["key_filename"] = [spec.identity_file]
        connection = Connection(host=spec.host, user=spec.user, port=spec.port, config=Config(),
                                connect_timeout=spec.tcp_connect_timeout,
                                connect_kwargs=connect_kwargs)
        self._check_host_keys(connection)
        try:
            self._use_early_connection(connection)  # its timeout is reported as Fabric's would be
            connection.open()
        except HostKeyError as exc:
            raise HostKeyError(f"{spec.name}: {exc.message}", hint=exc.hint) from None
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                f"{spec.name}: host key for {exc.hostname} has CHANGED: got {exc.key.get_name()} "
                f"{fingerprint(exc.key)}, expected {fingerprint(exc.expected_key)}",
                hint="possible man-in-the-middle; if the node was reinstalled, remove the old key "
                "with ssh-keygen -R",
            ) from exc
        except paramiko.AuthenticationException as exc:
            raise TransportError(f"{spec.name}: authentication failed for {spec.address}: {exc}",
                                 hint="check user and identity_file") from exc
        except TimeoutError as exc:
            raise TransportError(f"{spec.name}: {spec.address} did not answer within "
                                 f"{spec.connect_timeout:g} s") from exc
        except (paramiko.SSHException, OSError, EOFError) as exc:
            if str(exc).startswith(_HANDSHAKE_TIMEOUTS):
                raise TransportError(f"{spec.name}: {spec.address} did not complete the SSH handshake within "
                                     f"{spec.connect_timeout:g} s") from exc
            raise TransportError(f"{spec.name} ({spec.address}): {_why_not_connected(exc)}") from exc
        watch_link(connection.transport, spec.connect_timeout)
        return connection

    def _use_early_connection(self, connection: Connection) -> None:
        """Hand Fabric the socket connected early if it goes where Fabric would connect."""
        early, self._early = self._early, None
        if early is None:
            return
        if connection.gateway is not None:  # ProxyJump / ProxyCommand: Fabric opens the way
            early.drop()
            return
        # Raises the timeout if it timed out: connecting again would wait as long again.
        sock = early.take(connection.host, int(connection.port))
        if sock is not None:
            connection.connect_kwargs["sock"] = sock

    def _check_host_keys(self, connection: Connection) -> None:
        """Check this hop's host key as OpenSSH would, and every ProxyJump hop's before it.

        Fabric builds the jump hosts of ``ProxyJump`` as Connections of their own, which
        would trust any key: each gets the same known_hosts files and policy.
        """
        spec = self.spec
        client = connection.client
        default_known_hosts = Path.home() / ".ssh" / "known_hosts"
        known_files = [default_known_hosts]
        configured = connection.ssh_config.get("userknownhostsfile")
        if configured:
            known_files += [Path(os.path.expanduser(p)) for p in configured.split()]
        if spec.known_hosts:
            known_files.append(Path(spec.known_hosts))
        try:
            revoked = load_known_hosts(client, [known for known in known_files if known.is_file()])
        except HostKeyError as exc:
            raise HostKeyError(f"{spec.name}: {exc.message}") from exc
        if spec.host_key_policy == "accept-new":
            target = Path(spec.known_hosts) if spec.known_hosts else default_known_hosts
            client.set_missing_host_key_policy(_AcceptNewPolicy(target, revoked))
        else:
            client.set_missing_host_key_policy(_StrictPolicy(revoked))
        if isinstance(connection.gateway, Connection):
            self._check_host_keys(connection.gateway)

    def _start(self, command: str) -> RawChannel:
        self._connection = self._connect()
        self.reached = True
        try:
            channel = self._connection.transport.open_session(window_size=WINDOW_SIZE,
                                                              max_packet_size=MAX_PACKET)
            channel.exec_command(command)
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise TransportError(f"{self.spec.name}: cannot start the agent: {exc}") from exc
        stdin = _ChannelWriter(channel)
        stdout = _ChannelReader(channel)
        stderr = channel.makefile_stderr("rb", -1)

        def close() -> str:
            try:
                channel.shutdown_write()
                channel.settimeout(5)
                text = stderr.read().decode("utf-8", "replace")
            except (OSError, paramiko.SSHException, EOFError):
                text = ""
            channel.close()
            return text

        def leave() -> None:
            stdin.close()  # end-of-file on the agent's stdin
            channel.close()

        # Closing the channel wakes a thread blocked reading it; sshd then ends the agent.
        return RawChannel(stdin, stdout, close, leave, kill=channel.close)

    def _disconnect(self) -> None:
        if self._connection is not None:
            connection, self._connection = self._connection, None
            connection.close()
