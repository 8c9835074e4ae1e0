"""A node that is a folder on this machine: the agent runs as a local subprocess.

``FolderTransport`` reads any folder as a node's tree (a folder given as a ref): the same
agent lists the folder, and its paths are renamed to the tracked paths it stands for.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from snapver.config import NodeSpec
from snapver.errors import TransportError
from snapver.model import StatEntry
from snapver.transport.base import AgentTransport, FileItem, Listing, RawChannel, StatKeys, agent_command

_Kind = TypeVar("_Kind")
_Content = TypeVar("_Content")


def spawn(node: str, argv: list[str]) -> RawChannel:
    """Start ``argv`` on this machine with its stdin and stdout as the agent's channel.

    A session of its own: a Ctrl-C at the terminal must not kill the agent under a push
    that then undoes what it wrote through it (snapver ends it itself). An ``argv[0]``
    that cannot be run raises TransportError, chained to the OSError."""
    try:
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, start_new_session=True,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except OSError as exc:
        raise TransportError(f"{node}: cannot start the local agent: {exc}") from exc
    stdin, stdout = process.stdin, process.stdout
    assert stdin is not None and stdout is not None

    def close() -> str:
        for pipe in (stdin, stdout):
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

    return RawChannel(stdin, stdout, close, kill=process.kill)


class LocalTransport(AgentTransport):
    """The same agent and protocol as SSH, over a subprocess's pipes."""

    def _start(self, command: str) -> RawChannel:
        if self.spec.python is None:
            command = agent_command(sys.executable, no_site=bool(self.spec.site_packages))
        return spawn(self.spec.name, ["/bin/sh", "-c", command])


class FolderTransport(LocalTransport):
    """A local folder as a live tree: the agent walks ``spec.paths`` (folders below
    ``spec.site_packages``), and every path it names is reported as the tracked path the
    folder stands for (``roots``: ``(disk, tracked)`` pairs), and asked back that way."""

    def __init__(self, spec: NodeSpec, roots: tuple[tuple[str, str], ...]) -> None:
        super().__init__(spec)
        self.roots = roots

    def _rename(self, path: str, pairs: Any) -> str:
        for old, new in pairs:
            if path == old or path.startswith(old + "/"):
                return new + path[len(old):]
        return path

    def _to_tracked(self, path: str) -> str:
        return self._rename(path, self.roots)

    def _to_disk(self, path: str) -> str:
        return self._rename(path, [(tracked, disk) for disk, tracked in self.roots])

    def _on_disk(self, paths: list[str]) -> list[str]:
        """Tracked paths asked for, as the agent finds them in the folder."""
        return [self._to_disk(path) for path in paths]

    def _as_tracked(self, items: Iterator[tuple[str, _Kind, _Content]]) -> Iterator[tuple[str, _Kind, _Content]]:
        """A file stream's items, each named by the tracked path it stands for."""
        for path, kind, data in items:
            yield self._to_tracked(path), kind, data

    def request_listing(self, cache: dict[str, StatEntry] | None = None, cache_time_ns: int = 0,
                        want_oids: bool = True, cache_keys: StatKeys | None = None,
                        rows_if_unchanged: bool = True) -> Callable[[], Listing]:
        # No stat cache: a folder is listed in full, hashed, each time.
        wait = super().request_listing(None, 0, want_oids)

        def renamed() -> Listing:
            listing = wait()
            entries = [entry._replace(path=self._to_tracked(entry.path)) for entry in listing.entries]
            return Listing(listing.now_ns, entries, listing.hashed)

        return renamed

    def read_files(self, paths: list[str], compress_level: int = 0) -> Iterator[tuple[str, str | None, bytes]]:
        yield from self._as_tracked(super().read_files(self._on_disk(paths), compress_level))

    def stream_files(self, paths: list[str], compress_level: int = 0) -> Iterator[FileItem]:
        yield from self._as_tracked(super().stream_files(self._on_disk(paths), compress_level))

    def request_listed_files(self, compress_level: int = 0) -> Callable[[list[str]], Iterator[FileItem]]:
        stream = super().request_listed_files(compress_level)
        return lambda paths: self._as_tracked(stream(self._on_disk(paths)))

    def hash_files(self, paths: list[str], algo: str = "sha256") -> dict[str, str | None]:
        hashes = super().hash_files(self._on_disk(paths), algo)
        return {self._to_tracked(path): digest for path, digest in hashes.items()}
