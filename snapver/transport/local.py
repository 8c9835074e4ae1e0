"""A node that is a folder on this machine: the agent runs as a local subprocess."""

from __future__ import annotations

import subprocess
import sys

from snapver.errors import TransportError
from snapver.transport.base import RawChannel, Transport, agent_command


class LocalTransport(Transport):
    """The same agent and protocol as SSH, over a subprocess's pipes."""

    def _start(self, command: str) -> RawChannel:
        if self.spec.python is None:
            command = agent_command(sys.executable, no_site=bool(self.spec.site_packages))
        try:
            process = subprocess.Popen(["/bin/sh", "-c", command], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        except OSError as exc:
            raise TransportError(f"{self.spec.name}: cannot start the local agent: {exc}") from exc
        assert process.stdin is not None and process.stdout is not None

        def close() -> str:
            for pipe in (process.stdin, process.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
            try:
                stderr = process.stderr.read() if process.stderr else b""
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                stderr = b""
            return stderr.decode("utf-8", "replace")

        return RawChannel(process.stdin, process.stdout, close, kill=process.kill)
