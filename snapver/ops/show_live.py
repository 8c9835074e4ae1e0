"""show NODE@live PATH: one live file of a node, in pieces as the node reads it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from snapver.config import Config
from snapver.errors import TransportError
from snapver.folders import tracked_paths
from snapver.ops.trees import normalize_paths, one_path
from snapver.transport.base import FileChanged, StreamedFile, Transport
from snapver.transport.connect import open_transport


@dataclass
class LiveFile:
    """A live file being read: its path, kind and content pieces; ``close`` ends the session."""

    node: str
    path: str
    kind: str
    pieces: Iterator[bytes | memoryview]
    transport: Transport = field(repr=False)

    def close(self) -> None:
        self.transport.close()


def show_live(config: Config, node: str, operand: str) -> LiveFile:
    """Open ``node``, find the file ``operand`` names (the grammar of ``diff -- PATH``) in its
    live tree, and start reading it; the caller iterates ``pieces`` and closes it."""
    transport = open_transport(config.node(node)).start()
    try:
        listed = [entry.path for entry in transport.list_tree(want_oids=False).entries]
        roots = list(dict.fromkeys([*tracked_paths(config), *config.node(node).paths]))
        path = one_path(normalize_paths([operand])[0], listed, roots, f"{node} (live)")
        stream = transport.stream_files([path])
        _, kind, data = next(stream)
        if kind is None:
            raise TransportError(f"{path} vanished from {node} while it was read", hint="run the command again")
        pieces = _pieces(node, path, data, stream)
        return LiveFile(node, path, kind, pieces, transport)
    except BaseException:
        transport.close()
        raise


def _pieces(node: str, path: str, data: bytes | StreamedFile,
            stream: Iterator[object]) -> Iterator[bytes | memoryview]:
    if not isinstance(data, StreamedFile):
        yield data
        return
    try:
        yield from data
    except FileChanged:
        # What was printed is void; a reader of a changing file gets an error, not a mix.
        raise TransportError(f"{path} changed on {node} while it was read: the output above is incomplete",
                             hint="run the command again") from None
    for _rest in stream:  # the stream's end, to keep the session in step
        pass

