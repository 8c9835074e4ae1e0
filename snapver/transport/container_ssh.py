"""A node in a container on an SSH host: the engine's exec runs in the host's shell.

Apart from ``container.py`` because it imports the SSH transport (paramiko and Fabric),
which a container on this machine never needs.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from snapver.transport.base import RawChannel
from snapver.transport.container import ContainerTransport
from snapver.transport.mux import MuxTransport
from snapver.transport.ssh import SshTransport


def _direct_shell(transport: ContainerTransport) -> tuple[Callable[[str], RawChannel], Callable[[], None]]:
    """A connection of its own for a host command: a restart is rare, and never shares the
    agent's channel, nor the mux (which keeps a spare running the last line it ran)."""
    host = SshTransport(transport.spec)
    return host._start, host._disconnect


class SshContainerTransport(ContainerTransport, SshTransport):
    """A container on an SSH host."""

    def _host_start(self, argv: list[str]) -> RawChannel:
        return SshTransport._start(self, shlex.join(argv))

    def _host_shell(self) -> tuple[Callable[[str], RawChannel], Callable[[], None]]:
        return _direct_shell(self)


class MuxContainerTransport(ContainerTransport, MuxTransport):
    """A container on an SSH host, through the node's persistent connection."""

    def _host_start(self, argv: list[str]) -> RawChannel:
        return MuxTransport._start(self, shlex.join(argv))

    def _host_shell(self) -> tuple[Callable[[str], RawChannel], Callable[[], None]]:
        return _direct_shell(self)
