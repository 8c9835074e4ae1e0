"""Bytes that arrive in pieces and are taken in other sizes, with at most one copy each.

A file stream arrives as decompressed pieces of a few MB holding many files, and over SSH
as whatever the channel has buffered; appending them to one growing buffer and slicing
it copied every byte two or three times more, each time into fresh memory whose pages
fault in.
"""

from __future__ import annotations

from collections import deque


class ByteQueue:
    """A FIFO of bytes: ``put`` whole pieces, ``take`` any number of bytes from the front."""

    def __init__(self) -> None:
        self._pieces: deque[bytes] = deque()
        self._offset = 0  # bytes of the first piece already taken
        self.size = 0  # bytes held

    def put(self, piece: bytes) -> None:
        if piece:
            self._pieces.append(piece)
            self.size += len(piece)

    def take_view(self, count: int) -> bytes | memoryview:
        """``take``, but a view (no copy) when the bytes lie within one piece."""
        head = self._pieces[0] if self._pieces else b""
        if self._offset + count <= len(head) and count:
            view = memoryview(head)[self._offset:self._offset + count]
            self.size -= count
            self._offset += count
            if self._offset == len(head):
                self._pieces.popleft()
                self._offset = 0
            return view
        return self.take(count)

    def take(self, count: int) -> bytes:
        """The next ``count`` bytes (all that is held if fewer)."""
        count = min(count, self.size)
        if not count:
            return b""
        self.size -= count
        head = self._pieces[0]
        start = self._offset
        end = start + count
        if end < len(head):
            self._offset = end
            return head[start:end]
        if end == len(head):  # the rest of the first piece: no copy if it is the whole piece
            self._pieces.popleft()
            self._offset = 0
            return head if start == 0 else head[start:]
        parts = []
        needed = count
        while needed:
            head = self._pieces[0]
            part = memoryview(head)[self._offset:self._offset + needed]  # copied once, by join
            parts.append(part)
            needed -= len(part)
            if self._offset + len(part) == len(head):
                self._pieces.popleft()
                self._offset = 0
            else:
                self._offset += len(part)
        return b"".join(parts)
