"""The usage an answer's end gives, read from the last two chunks relayed: the one parser
the access log and the online samples share."""

from __future__ import annotations

import pytest

from specroute.router.backends.flight import Tail, usage

EVENT = b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":64}}\n\n'
DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    ("tail", "found"),
    [
        ((b"", EVENT), {"prompt_tokens": 5, "completion_tokens": 64}),
        ((EVENT, DONE), {"prompt_tokens": 5, "completion_tokens": 64}),  # [DONE] apart
        (
            (b"", b'{"usage": {"completion_tokens": 7, "total_tokens": 12}}'),
            {"completion_tokens": 7},
        ),
        (
            (b"", b'{"meta_info": {"prompt_tokens": 3, "completion_tokens": 9}}'),
            {"prompt_tokens": 3, "completion_tokens": 9},
        ),
        ((b'"completion_tokens": 10', b'"completion_tokens": 11'), {"completion_tokens": 11}),
        ((b"", DONE), {}),
        ((b"", b'"completion_tokens":null'), {}),
        ((b"", b'"completion_tokens": 1234567890123'), {}),  # past 12 digits: not a count
        ((EVENT + b" " * 5000, DONE), {}),  # further back than what is searched
    ],
    ids=[
        "stream-event",
        "event-then-done",
        "whole-body",
        "generate-meta-info",
        "last-count-wins",
        "no-usage",
        "null",
        "too-long",
        "too-far-back",
    ],
)
def test_the_usage_is_read_from_the_answer_s_last_two_chunks(
    tail: Tail, found: dict[str, int]
) -> None:
    assert usage(tail) == found
