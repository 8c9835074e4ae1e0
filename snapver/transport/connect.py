"""Which transport serves a node: the one module that knows the implementations.

``transport/base.py`` holds the protocol; the implementations (``local``, ``mux``,
``ssh``) import it, and this module imports them, so the protocol sits below them with
no import circle. Each implementation is imported only when a node needs it (paramiko
and Fabric cost ~150 ms of start-up).
"""

from __future__ import annotations

from snapver.config import NodeSpec
from snapver.transport.base import Transport


def open_transport(spec: NodeSpec) -> Transport:
    """The transport for a node spec: a local folder or SSH (imported only when needed)."""
    if spec.local:
        from snapver.transport.local import LocalTransport

        return LocalTransport(spec)
    if spec.control_persist > 0:
        from snapver.transport.mux import MuxTransport

        return MuxTransport(spec)
    from snapver.transport.early import EarlyConnection, is_ip_address

    # A node named by its address: connecting begins now, while the import below (paramiko,
    # Fabric: ~150 ms) runs. (A name could be an ssh_config alias: no lookup is made for it.)
    early = None
    if spec.host and is_ip_address(spec.host):
        early = EarlyConnection(spec.host, spec.port or 22, spec.tcp_connect_timeout)
    from snapver.transport.ssh import SshTransport

    return SshTransport(spec, early=early)
