"""A TCP connection to a node's sshd, opened while paramiko and Fabric are imported.

Importing them delays a command's first connection, and the connection's first
round trip (TCP's handshake, then sshd's banner) need not wait for it: on a far link that
is one round trip less for every command. Only for a node given by IP address (a name
may be an ssh_config alias, not to be looked up), and the socket is used only if Fabric
resolves the node to this same address with no proxy (an ssh_config may say otherwise);
else it is closed unused and Fabric connects as it would have.
"""

from __future__ import annotations

import ipaddress
import socket
import threading


def is_ip_address(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


class EarlyConnection:
    """``socket.create_connection((host, port))`` in a thread of its own."""

    def __init__(self, host: str, port: int, timeout: float) -> None:
        self.address = (host, port)
        self._lock = threading.Lock()
        self._socket: socket.socket | None = None
        self._error: OSError | None = None
        self._dropped = False
        self._thread = threading.Thread(target=self._connect, args=(timeout,), daemon=True,
                                        name="snapver-early-connect")
        self._thread.start()

    def _connect(self, timeout: float) -> None:
        sock, error = None, None
        host, port = self.address
        try:
            # The address as bytes: a str is encoded with the "idna" codec first, whose
            # import (stringprep, unicodedata) every command would pay.
            sock = socket.create_connection((host.encode("ascii"), port), timeout=timeout)  # type: ignore[arg-type]  # socket takes bytes; typeshed says str
        except OSError as exc:
            error = exc
        with self._lock:
            if self._dropped:
                if sock is not None:
                    sock.close()
                return
            self._socket, self._error = sock, error

    def take(self, host: str, port: int) -> socket.socket | None:
        """The connected socket if it goes to ``(host, port)``; else None, and it is dropped.

        Raises the timeout if connecting to that address timed out (trying again would wait
        as long again); any other failure gives None: the caller connects and reports.
        """
        if (host, port) != self.address:
            self.drop()
            return None
        self._thread.join()
        with self._lock:
            sock, self._socket = self._socket, None
        if sock is None and isinstance(self._error, (socket.timeout, TimeoutError)):
            raise self._error
        return sock

    def drop(self) -> None:
        """Not wanted: close it, now or when it connects (without waiting for that)."""
        with self._lock:
            self._dropped = True
            sock, self._socket = self._socket, None
        if sock is not None:
            sock.close()
