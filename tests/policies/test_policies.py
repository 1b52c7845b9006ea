"""Policies as tables of named cases: a snapshot in, a decision out."""

from __future__ import annotations

from typing import Any

import pytest

from specroute.policies.decision import PolicyError
from specroute.policies.profile import ProfileError, parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import BackendView, ConcurrencySource, RequestInfo, View

REQUEST = RequestInfo(path="/v1/chat/completions")


def view(
    spec: int,
    base: int,
    *,
    spec_up: bool = True,
    base_up: bool = True,
    spec_reported: int | None = None,
    source: str = "router",
) -> View:
    return View(
        (
            BackendView("s1", "spec", spec_up, spec, running=spec_reported),
            BackendView("b1", "base", base_up, base),
        ),
        source=ConcurrencySource(source),
    )


CASES: list[tuple[str, str, dict[str, Any], View, tuple[str, str | None, str]]] = [
    (
        "idle goes to spec",
        "crossover",
        {"crossover": 4},
        view(0, 0),
        ("spec", "s1", "below_crossover"),
    ),
    (
        "the 4th joins 4: still spec",
        "crossover",
        {"crossover": 4},
        view(2, 1),
        ("spec", "s1", "below_crossover"),
    ),
    (
        "the 5th would make 5: base",
        "crossover",
        {"crossover": 4},
        view(3, 1),
        ("base", "b1", "above_crossover"),
    ),
    (
        "shared counts both pools",
        "crossover",
        {"crossover": 4},
        view(0, 4),
        ("base", "b1", "above_crossover"),
    ),
    (
        "partitioned fills spec only",
        "crossover",
        {"crossover": 4, "topology": "partitioned"},
        view(3, 50),
        ("spec", "s1", "below_crossover"),
    ),
    (
        "partitioned spills",
        "crossover",
        {"crossover": 4, "topology": "partitioned"},
        view(4, 0),
        ("base", "b1", "above_crossover"),
    ),
    (
        "failover when spec is down",
        "crossover",
        {"crossover": 4},
        view(0, 0, spec_up=False),
        ("base", "b1", "failover"),
    ),
    (
        "failover when base is down",
        "crossover",
        {"crossover": 1},
        view(5, 0, base_up=False),
        ("spec", "s1", "failover"),
    ),
    (
        "nothing healthy",
        "crossover",
        {"crossover": 4},
        view(0, 0, spec_up=False, base_up=False),
        ("spec", None, "no_healthy_backend"),
    ),
    (
        "backend-reported load",
        "crossover",
        {"crossover": 4},
        view(0, 0, spec_reported=9, source="backend"),
        ("base", "b1", "above_crossover"),
    ),
    (
        "max of the two",
        "crossover",
        {"crossover": 4},
        view(1, 0, spec_reported=6, source="max"),
        ("base", "b1", "above_crossover"),
    ),
    (
        "stale report falls back to own count",
        "crossover",
        {"crossover": 4},
        view(1, 0, source="backend"),
        ("spec", "s1", "below_crossover"),
    ),
    ("always-spec", "always-spec", {}, view(100, 0), ("spec", "s1", "static")),
    ("always-base", "always-base", {}, view(0, 0), ("base", "b1", "static")),
]


@pytest.mark.parametrize(
    ("name", "policy", "params", "snapshot", "expected"), CASES, ids=[c[0] for c in CASES]
)
def test_decisions(
    name: str,
    policy: str,
    params: dict[str, Any],
    snapshot: View,
    expected: tuple[str, str | None, str],
) -> None:
    decision = build_policy(policy, params, None).choose(REQUEST, snapshot)
    assert (decision.pool, decision.backend, decision.reason) == expected


def test_hysteresis_holds_the_choice_near_the_threshold() -> None:
    policy = build_policy("crossover", {"crossover": 4, "hysteresis": 2}, None)
    pools = [policy.choose(REQUEST, view(load, 0)).pool for load in (3, 4, 3, 2, 1, 0)]
    assert pools == ["spec", "base", "base", "base", "spec", "spec"]


def test_round_robin_alternates() -> None:
    policy = build_policy("round-robin", {}, None)
    assert [policy.choose(REQUEST, view(0, 0)).pool for _ in range(4)] == ["spec", "base"] * 2


@pytest.mark.parametrize(
    ("policy", "params", "message"),
    [
        ("crossover", {"crossover": "many"}, "crossover='many'"),
        ("crossover", {"topology": "mesh"}, "topology='mesh'"),
        ("crossover", {"crossover": -1}, "crossover must be >= 0"),
        ("crossover", {"crosover": 3}, "policy 'crossover': unknown parameter 'crosover'"),
        ("crossover", {}, "give crossover=N or a profile"),
        ("always-spec", {"x": 1}, r"'always-spec': unknown parameter 'x' \(it takes none"),
        ("fastest", {}, "unknown policy 'fastest'"),
    ],
)
def test_bad_parameters_name_the_policy_and_key(
    policy: str, params: dict[str, Any], message: str
) -> None:
    with pytest.raises(PolicyError, match=message):
        build_policy(policy, params, None)


@pytest.mark.parametrize(
    ("workload", "contexts"),
    [
        ({"mean_prompt_tokens": 512.4, "mean_output_tokens": 100.0}, (562.4,)),  # calibrated
        ({"input_len": 8192, "output_len": 128}, (8256.0,)),  # predicted
        (
            {
                "kind": "sharegpt",
                "input_len": 64,
                "mean_prompt_tokens": None,
                "mean_output_tokens": 32,
            },
            (80.0,),
        ),  # a mean unknown: the dataset's length
        ({"mean_prompt_tokens": 512}, ()),  # no answers said
        ({"mean_prompt_tokens": -1, "mean_output_tokens": 8}, ()),
        ("512 tokens", ()),
        (None, ()),
    ],
)
def test_a_profile_says_the_context_it_was_measured_at(
    workload: Any, contexts: tuple[float, ...]
) -> None:
    data = {"schema": "specroute.profile/v1", "crossover": {"value": 6.5, "ci": [5.0, 8.0]}}
    assert parse_profile(data | {"workload": workload}).contexts == contexts


def test_profile_gives_the_crossover() -> None:
    profile = parse_profile(
        {"schema": "specroute.profile/v1", "crossover": {"value": 6.5, "ci": [5.0, 8.0]}}
    )
    policy = build_policy("crossover", {}, profile)
    assert policy.describe()["crossover"] == 6.5
    assert policy.choose(REQUEST, view(5, 0)).pool == "spec"
    assert policy.choose(REQUEST, view(6, 0)).pool == "base"
    everywhere = parse_profile(
        {
            "schema": "specroute.profile/v1",
            "crossover": {"value": None, "bound": "above", "limit": 64},
        }
    )
    bounded = build_policy("crossover", {}, everywhere)
    assert bounded.choose(REQUEST, view(63, 0)).pool == "spec"  # measured: it paid up to 64
    assert bounded.choose(REQUEST, view(500, 0)).pool == "base"  # never measured: no guess
    assert everywhere.crossover.note is not None and "not past it" in everywhere.crossover.note
    nowhere = parse_profile(
        {
            "schema": "specroute.profile/v1",
            "crossover": {"value": None, "bound": "below", "limit": 1},
        }
    )
    assert build_policy("crossover", {}, nowhere).choose(REQUEST, view(0, 0)).pool == "base"
    assert profile.crossover.note is None


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            {"schema": "specroute.profile/v0", "crossover": {"value": 1, "ci": [1, 1]}},
            "unsupported profile schema",
        ),
        ({"schema": "specroute.profile/v1"}, "needs 'crossover'"),
        (
            {"schema": "specroute.profile/v1", "crossover": {"value": 5, "ci": [7, 6]}},
            r"must be \[low, high\]",
        ),
        (
            {"schema": "specroute.profile/v1", "crossover": {"value": 5, "ci": [4, "6"]}},
            r"must be \[low, high\]",
        ),
        (
            {
                "schema": "specroute.profile/v1",
                "crossover": {"value": 5, "ci": [4, None], "ci_open": "sideways"},
            },
            "ci_open",
        ),
        ({"schema": "specroute.profile/v1", "crossover": {"value": None}}, "bound"),
    ],
)
def test_bad_profiles_are_refused(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        parse_profile(data)


@pytest.mark.parametrize(
    ("ci", "expected"),
    [
        ([4.0, 6.0], (4.0, 6.0)),
        ([4.0, None], (4.0, None)),  # at least 4: the crossover may lie past the levels
        ([None, 6.0], (None, 6.0)),
        ([5.5, 7.0], (5.5, 7.0)),  # an interval need not contain the point estimate
    ],
)
def test_open_and_off_centre_intervals_load(
    ci: list[float | None], expected: tuple[float | None, float | None]
) -> None:
    opened = "above" if ci[1] is None else "below" if ci[0] is None else None
    profile = parse_profile(
        {"schema": "specroute.profile/v1", "crossover": {"value": 5, "ci": ci, "ci_open": opened}}
    )
    assert profile.crossover.ci == expected
    assert build_policy("crossover", {}, profile).crossover() == 5
