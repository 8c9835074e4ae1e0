"""When ``compress = "auto"`` compresses a file stream (a pure decision on measured round trips)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from snapver.ops.snapshot import COMPRESS_RTT_SECONDS, _compress_level

SLOW, FAST = COMPRESS_RTT_SECONDS * 1.5, COMPRESS_RTT_SECONDS / 10


class Pings:
    """A transport whose round trips take the given times, in order."""

    def __init__(self, compress: str, times: list[float]) -> None:
        self.spec = SimpleNamespace(compress=compress)
        self.times = list(times)
        self.asked = 0

    def ping(self) -> float:
        self.asked += 1
        return self.times.pop(0)


@pytest.mark.parametrize("times, level, asked", [
    ([SLOW, SLOW], 1, 2),  # a far link: every try slow
    ([SLOW, FAST], 0, 2),  # one slow answer was a busy moment
    ([FAST, SLOW], 0, 1),  # a near link is known at once
])
def test_auto_compresses_only_when_every_try_is_slow(times, level, asked):
    transport = Pings("auto", times)
    assert _compress_level(transport) == level
    assert transport.asked == asked


@pytest.mark.parametrize("compress, level", [("zlib", 1), ("none", 0)])
def test_a_configured_choice_asks_nothing(compress, level):
    transport = Pings(compress, [])
    assert _compress_level(transport) == level and transport.asked == 0
