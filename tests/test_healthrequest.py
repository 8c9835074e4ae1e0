"""The health request's pure parts: the compared part of a reply, and two answers shown."""

from __future__ import annotations

import pytest

from snapver.healthrequest import AnswerError, select_answer, shorten_pair


@pytest.mark.parametrize(("body", "match", "want"), [
    ('{"text": "Paris"}', "text", "Paris"),
    ('{"choices": [{"text": "a"}, {"text": "b"}]}', "choices.1.text", "b"),
    ('{"x": {"b": 1, "a": [2]}}', "x", '{"a": [2], "b": 1}'),
    ("plain text", None, "plain text"),
])
def test_the_compared_part_of_a_reply(body, match, want) -> None:
    assert select_answer(body, match) == want


@pytest.mark.parametrize(("body", "match"), [("not json", "text"), ('{"a": 1}', "b"), ('{"c": [1]}', "c.1"),
                                             ('{"c": [1]}', "c.x")])
def test_a_reply_without_the_compared_part(body, match) -> None:
    with pytest.raises(AnswerError):
        select_answer(body, match)


def test_two_answers_are_shown_around_where_they_differ_and_quoted() -> None:
    before, after = "a" * 500 + "Paris" + "b" * 500, "a" * 500 + "Lyon\x1b[2J" + "b" * 500
    old, new = shorten_pair(before, after)
    assert "Paris" in old and "Lyon\\033[2J" in new and "\x1b" not in new
    assert old.startswith("…\"") and "(1005 characters)" in old
