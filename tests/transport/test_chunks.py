"""ByteQueue: pieces in, any sizes out, the same bytes in the same order."""

from __future__ import annotations

import random

from snapver.transport.chunks import ByteQueue


def test_any_piece_and_take_sizes_give_back_the_same_bytes() -> None:
    rng = random.Random(7)
    for _ in range(300):
        data = rng.randbytes(rng.randint(0, 400))
        queue = ByteQueue()
        taken = []
        cut = 0
        while cut < len(data) or queue.size:
            if cut < len(data) and rng.random() < 0.5:
                size = rng.randint(0, 60)
                queue.put(data[cut:cut + size])
                cut += size
            else:
                before = queue.size
                part = queue.take(rng.randint(0, 90))
                assert type(part) is bytes
                assert queue.size == before - len(part)
                taken.append(part)
        assert b"".join(taken) == data


def test_taking_from_an_empty_queue_gives_nothing() -> None:
    queue = ByteQueue()
    assert queue.take(0) == b"" and queue.take(5) == b""
    queue.put(b"abc")
    assert queue.take(10) == b"abc" and queue.size == 0
    assert queue.take(1) == b""


def test_a_whole_piece_comes_back_without_a_copy() -> None:
    piece = b"x" * 1000
    queue = ByteQueue()
    queue.put(piece)
    queue.put(b"tail")
    assert queue.take(1000) is piece
    assert queue.take(4) == b"tail"
