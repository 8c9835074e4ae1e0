"""The failure budget of a rollout (``push --max-fail N|P%``, ``[defaults] max_fail``): how
many units (a node, or a serving group) may fail and be rolled back while the push goes
on, as Ansible's ``max_fail_percentage``. Pure text to numbers, no I/O."""

from __future__ import annotations

from snapver.errors import UsageError

HINT = "e.g. --max-fail 1 (one unit may fail) or --max-fail 25% (a quarter of the units, rounded down)"


def parse_max_fail(value: str | int, what: str = "--max-fail") -> tuple[int, bool]:
    """``2`` → (2, False), ``"50%"`` → (50, True): a count of units (0 or more) or a
    percentage 0-100 of them. Anything else is a usage error naming ``what``."""
    text = str(value).strip() if not isinstance(value, bool) else repr(value)
    percent = text.endswith("%")
    number = text[:-1].strip() if percent else text
    if not number.isdigit() or not number.isascii():
        raise UsageError(f"{what}: {text!r} is not a number of units or a percentage", hint=HINT)
    if percent and int(number) > 100:
        raise UsageError(f"{what}: {text!r} is out of range (a percentage is 0-100%)", hint=HINT)
    return int(number), percent


def allowed_failures(value: str | int | None, units: int) -> int:
    """How many of ``units`` may fail under the budget ``value`` (None: 0); a percentage
    rounds down, so ``50%`` of 3 units is 1."""
    if value is None:
        return 0
    number, percent = parse_max_fail(value)
    return units * number // 100 if percent else number
