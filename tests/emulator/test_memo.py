"""Prompt-text functions remembered by the text's hash: the same answers, computed once."""

from __future__ import annotations

from specroute.emulator import memo
from specroute.emulator.acceptance import Acceptance, parse_rules
from specroute.emulator.vocabulary import count_tokens


def test_a_text_is_computed_once_per_other_arguments_and_the_memory_is_bounded() -> None:
    calls: list[tuple[str, int]] = []

    @memo.by_text
    def length_times(text: str, k: int) -> int:
        calls.append((text, k))
        return len(text) * k

    long = "word " * 10_000
    again = "".join(["word "] * 10_000)  # equal, another object
    assert [length_times(long, 2), length_times(again, 2), length_times(long, 3)] == [
        100_000,
        100_000,
        150_000,
    ]
    assert calls == [(long, 2), (long, 3)]
    for i in range(memo.SIZE):
        length_times(str(i), 1)
    assert len(calls) == 2 + memo.SIZE
    length_times(long, 2)  # forgotten when the memory started again
    assert len(calls) == 3 + memo.SIZE


def test_remembered_answers_are_the_computed_ones() -> None:
    code = "```python\ndef f():\n    return 1\n```"
    rules = parse_rules([{"name": "code", "pattern": r"\bdef ", "accept_length": 3.0}], 3)
    acceptance, plain = Acceptance(3, 0.5, rules), Acceptance(3, 0.5)
    assert [acceptance.rate_for(t) for t in (code, "hello", code)] == [
        rules[0].rate,
        0.5,
        rules[0].rate,
    ]
    assert plain.rate_for(code) == 0.5  # the same text under other rules: not the same answer
    other = Acceptance(
        3, 0.5, parse_rules([{"name": "c", "pattern": "zzz", "accept_rate": 0.9}], 3)
    )
    assert other.rate_for(code) == 0.5
    assert [count_tokens(t) for t in ("a b, c", "a b, c", "")] == [4, 4, 0]
