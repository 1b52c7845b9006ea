from __future__ import annotations

import random

import pytest

from specroute.emulator.acceptance import (
    Acceptance,
    AcceptanceError,
    accept_length,
    accept_rate,
    accepted_drafts,
    parse_rules,
)


@pytest.mark.parametrize(("length", "steps"), [(1.0, 3), (2.1, 3), (3.0, 3), (3.9, 3), (5.0, 7)])
def test_rate_and_length_are_inverse(length: float, steps: int) -> None:
    assert accept_length(accept_rate(length, steps), steps) == pytest.approx(length, abs=1e-9)


def test_sampled_accept_length_matches_the_formula() -> None:
    rng, rate = random.Random(1), accept_rate(3.0, 3)
    mean = sum(1 + accepted_drafts(rng, rate, 3) for _ in range(40_000)) / 40_000
    assert mean == pytest.approx(3.0, abs=0.03)


def test_rules_pick_the_rate_by_prompt() -> None:
    rules = parse_rules([{"name": "code", "pattern": r"\bdef ", "accept_length": 3.5}], 3)
    acceptance = Acceptance(3, accept_rate(2.5, 3), rules)
    assert acceptance.rate_for("def f(): pass") == pytest.approx(accept_rate(3.5, 3))
    assert acceptance.rate_for("hello") == pytest.approx(accept_rate(2.5, 3))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"accept_length": 5.0}, "outside"),
        ({"accept_rate": 1.5}, "outside"),
        ({"accept_rate": 0.5, "accept_length": 2.0}, "exactly one"),
        ({"bogus": 1}, "unknown field"),
        ({"rules": [{"pattern": "("}]}, "bad pattern"),
        ({"rules": "x"}, "expected a list"),
        ({"accept_length": "x"}, "not a number"),
    ],
)
def test_bad_changes_are_refused(change: dict[str, object], message: str) -> None:
    with pytest.raises(AcceptanceError, match=message):
        Acceptance(3, 0.5).updated(change)
