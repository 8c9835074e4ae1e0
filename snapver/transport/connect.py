"""Which transport serves a node: the one module that knows the implementations.

``transport/base.py`` holds the protocol; the implementations (``local``, ``mux``,
``ssh``) import it, and this module imports them, so the protocol sits below them with
no import circle. Each implementation is imported only when a node needs it (paramiko
and Fabric are slow to import).
"""

from __future__ import annotations

import threading

from snapver.config import NodeSpec
from snapver.errors import TransportError
from snapver.transport.base import Transport


def open_transport(spec: NodeSpec) -> Transport:
    """The transport for a node spec: a local folder, SSH, or a container on either
    (imported only when needed)."""
    if spec.in_container:
        return _container_transport(spec)
    if spec.local:
        from snapver.transport.local import LocalTransport

        return LocalTransport(spec)
    if spec.control_persist > 0:
        from snapver.transport.mux import MuxTransport

        return MuxTransport(spec)
    from snapver.transport.early import EarlyConnection, is_ip_address

    # A node named by its address: connecting begins now, while the slow import below
    # (paramiko, Fabric) runs. (A name could be an ssh_config alias: no lookup is made for it.)
    early = None
    if spec.host and is_ip_address(spec.host):
        early = EarlyConnection(spec.host, spec.port or 22, spec.tcp_connect_timeout)
    from snapver.transport.ssh import SshTransport

    return SshTransport(spec, early=early)


def _container_transport(spec: NodeSpec) -> Transport:
    if spec.local:
        from snapver.transport.container import LocalContainerTransport

        return LocalContainerTransport(spec)
    from snapver.transport import container_ssh

    if spec.control_persist > 0:
        return container_ssh.MuxContainerTransport(spec)
    return container_ssh.SshContainerTransport(spec)


# A start is a TCP connection, sshd's banner and authentication, each bounded by the
# node's connect_timeout, then the agent's session: a thread is waited for that long.
START_TIMEOUTS = 4


class Starting:
    """Nodes' transports started (connected, their agents launched) each in a thread of
    its own while the command goes on preparing: importing its operation, opening and
    locking the store. Under the GIL that work runs while the connections wait on the
    network and the nodes (key exchange, authentication, the node's shell), so a node
    starts listing sooner. A context manager: whatever was not
    taken is closed on leaving (a thread still connecting closes its own when done).
    """

    def __init__(self, specs: list[NodeSpec]) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._started: dict[str, Transport | BaseException] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._taken: set[str] = set()
        self._timeouts = {spec.name: START_TIMEOUTS * spec.connect_timeout for spec in specs}
        # Made here, not in the threads: the first one imports paramiko and Fabric (CPU
        # that would only take turns with ours), and begins its TCP connection meanwhile.
        transports = [(spec, open_transport(spec)) for spec in specs]
        for spec, transport in transports:
            thread = threading.Thread(target=self._start, args=(spec.name, transport), daemon=True,
                                      name=f"snapver-start-{spec.name}")
            self._threads[spec.name] = thread
            thread.start()

    def _start(self, name: str, transport: Transport) -> None:
        try:
            transport.start()
        except BaseException as exc:  # noqa: BLE001 - handed to whoever takes it, raised there
            with self._lock:
                self._started[name] = exc
            return
        with self._lock:
            closed = self._closed
            if not closed:
                self._started[name] = transport
        if closed:
            transport.close()

    def take(self, name: str) -> Transport | None:
        """The started transport of node ``name`` (now the caller's to close), or what
        starting it raised; None if none was begun for it, or it was taken already."""
        with self._lock:
            if name not in self._threads or name in self._taken:
                return None
            self._taken.add(name)
        timeout = self._timeouts[name]
        self._threads[name].join(timeout)
        with self._lock:
            started = self._started.pop(name, None)
        if started is None:
            raise TransportError(f"{name}: did not answer within {timeout:g} s")
        if isinstance(started, BaseException):
            raise started
        return started

    def close(self) -> None:
        """Close the transports not taken; those still starting close when started."""
        with self._lock:
            self._closed = True
            left = [t for t in self._started.values() if isinstance(t, Transport)]
            self._started.clear()
        for transport in left:
            transport.close()

    def __enter__(self) -> Starting:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
