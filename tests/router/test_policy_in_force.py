"""The policy in force: a new profile rebuilds it whole or not at all, whether posted or
read again from the profile file; real policies, real files."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from specroute.policies.registry import build_policy
from specroute.policies.view import TOKENS_PER_BYTE
from specroute.router.policy_in_force import PolicyInForce, digest_of


def profile(value: float) -> dict[str, Any]:
    return {"schema": "specroute.profile/v1", "crossover": {"value": value, "ci": [1, 99]}}


def with_context(tokens_per_byte: float) -> dict[str, Any]:
    bucket = {"context": 1000, "crossover": {"value": 6.0, "ci": [5, 7]}}
    axis = {"tokens_per_byte": tokens_per_byte, "buckets": [bucket]}
    return {"schema": "specroute.profile/v2", "crossover": bucket["crossover"], "context": axis}


def configured(crossover: float = 4, **more: Any) -> PolicyInForce:
    """The crossover policy as configured at start, with no profile."""
    params = {"crossover": crossover, **more}
    return PolicyInForce(build_policy("crossover", params, None), None, None, params)


def test_a_profile_s_crossover_wins_over_the_configured_one() -> None:
    in_force = configured(4, hysteresis=0.5)
    policy, read = in_force.built(profile(9))
    assert policy.name == "crossover" and policy.crossover() == 9
    assert policy.describe()["hysteresis"] == 0.5  # the other settings stay
    assert in_force.policy.crossover() == 4  # built, not yet adopted
    in_force.adopt(policy, read, "somewhere")
    assert in_force.policy is policy and in_force.profile is read
    assert in_force.source == "somewhere"


@pytest.mark.parametrize(
    "raw",
    [[], {"schema": "specroute.profile/v9"}, {"schema": "specroute.profile/v1"}],
    ids=["not an object", "an unknown schema", "no crossover"],
)
def test_a_bad_profile_is_a_value_error(raw: Any) -> None:
    with pytest.raises(ValueError, match="profile"):
        configured().built(raw)


# (case, the profile adopted, the tokens a byte the KV tokens in flight are estimated by)
TOKENS_CASES: list[tuple[str, dict[str, Any] | None, float]] = [
    ("no profile: the default", None, TOKENS_PER_BYTE),
    ("a profile without a context axis: the default", profile(3), TOKENS_PER_BYTE),
    ("a profile with one: its own", with_context(0.4), 0.4),
]


@pytest.mark.parametrize(
    ("raw", "tokens_per_byte"), [c[1:] for c in TOKENS_CASES], ids=[c[0] for c in TOKENS_CASES]
)
def test_the_tokens_a_byte_come_from_the_profile(
    raw: dict[str, Any] | None, tokens_per_byte: float
) -> None:
    in_force = configured()
    if raw is not None:
        in_force.adopt(*in_force.built(raw), "posted")
    assert in_force.tokens_per_byte == tokens_per_byte


def test_a_profile_without_a_measured_crossover_is_said(caplog: pytest.LogCaptureFixture) -> None:
    bound = {"value": None, "ci": None, "bound": "above", "limit": 16}
    in_force = configured()
    with caplog.at_level(logging.WARNING, "specroute.router"):
        in_force.adopt(*in_force.built(profile(1) | {"crossover": bound}), "the file")
    assert in_force.policy.crossover() == 16
    assert "profile the file: speculation paid at every level measured, up to 16" in caplog.text


# (case, what the file holds now, whether refused, the crossover in force after)
REREAD_CASES: list[tuple[str, str | None, bool, float]] = [
    ("unchanged: nothing to do", json.dumps(profile(6)), False, 4),
    ("changed and good: adopted", json.dumps(profile(8)), False, 8),
    ("not JSON: refused", "{not json", True, 4),
    ("not a profile: refused", json.dumps({"schema": "x"}), True, 4),
    ("one the policy refuses: refused", json.dumps(profile(-1)), True, 4),
    ("gone a moment: refused", None, True, 4),
]


@pytest.mark.parametrize(
    ("now", "refused", "crossover"), [c[1:] for c in REREAD_CASES], ids=[c[0] for c in REREAD_CASES]
)
def test_the_profile_file_read_again(
    tmp_path: Path, now: str | None, refused: bool, crossover: float
) -> None:
    """The file at start held ``profile(6)``, yet the configured crossover 4 is in force:
    unchanged, it is not read into force again."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile(6)))
    params = {"crossover": 4}
    in_force = PolicyInForce(
        build_policy("crossover", params, None), None, None, params, digest_of(path.read_bytes())
    )
    if now is None:
        path.unlink()
    else:
        path.write_text(now)
    assert in_force.reread(path) is refused
    assert in_force.policy.crossover() == crossover
    assert in_force.source == (str(path) if crossover != 4 else None)
    assert in_force.reread(path) is (now is None)  # the same content again: nothing new


def test_a_file_refused_once_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text("{not json")
    in_force = configured()
    assert in_force.reread(path)
    path.write_text(json.dumps(profile(7)))
    assert not in_force.reread(path) and in_force.policy.crossover() == 7
