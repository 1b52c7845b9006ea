"""The policies that read a profile's curves: ``expected-latency`` and
``acceptance-crossover``, as tables of snapshots and decisions."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specroute.policies.curves import context_curves, curves
from specroute.policies.decision import PolicyError
from specroute.policies.profile import Profile, ProfileError, parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import BackendView, RequestInfo, View
from tests.emulators import running_emulator
from tests.routers import running_router

REQUEST = RequestInfo(path="/v1/chat/completions")
# spec: 5, 10, 30 ms per token at 1, 4, 16; base: 10, 12, 20; spec capped at 8 running
LEVELS = [(1, 5.0, 10.0), (4, 10.0, 12.0), (16, 30.0, 20.0)]
PROFILE = parse_profile(
    {
        "schema": "specroute.profile/v1",
        "crossover": {"value": 6.0, "ci": [5.0, 7.0]},
        "levels": [
            {
                "concurrency": c,
                "spec": {"tpot_ms": {"median": s}},
                "base": {"tpot_ms": {"median": b}},
            }
            for c, s, b in LEVELS
        ],
        "servers": {"spec": {"max_running_requests": 8}, "base": {"max_running_requests": 64}},
        "acceptance": {"mean_accept_length": 3.0},
    }
)


def view(spec: int, base: int, accept: float | None = None, age: float = 1.0) -> View:
    return View(
        (
            BackendView(
                "s1",
                "spec",
                True,
                spec,
                accept_length=accept,
                accept_length_age=None if accept is None else age,
            ),
            BackendView("b1", "base", True, base),
        )
    )


def test_curves_interpolate_and_cross() -> None:
    found = curves(PROFILE)
    assert found.tpot["spec"].at(4) == pytest.approx(0.010)
    assert found.tpot["spec"].at(2) == pytest.approx(math.sqrt(0.005 * 0.010))  # a power law
    assert found.tpot["spec"].at(0.5) == pytest.approx(0.005)  # below the first level: the first
    assert found.tpot["base"].at(64) == pytest.approx(0.020 * 20 / 12)  # its last segment, on
    m4, m16 = math.log(12 / 10), math.log(20 / 30)  # the margin log(base / spec) at 4 and 16
    at = found.crossover()  # where the margin, linear in log concurrency, reaches zero
    assert at == pytest.approx(4 * 4 ** (m4 / (m4 - m16)))
    assert found.tpot["spec"].at(at) == pytest.approx(found.tpot["base"].at(at), rel=1e-12)
    assert found.crossover(0.5) > at > found.crossover(1.5)  # better acceptance pays longer
    assert found.max_running == {"spec": 8, "base": 64} and found.accept_length == 3.0


CASES: list[tuple[str, dict[str, Any], View, str]] = [
    ("idle: spec is faster", {}, view(0, 0), "spec"),
    ("spec at 3 still beats base at 1", {}, view(3, 0), "spec"),
    ("spec loaded, base idle", {}, view(7, 0), "base"),
    ("spec past its cap of 8 waits for a slot", {}, view(11, 28), "base"),  # 24 < 25 < 26 ms
    ("both busy, base busier", {}, view(5, 40), "spec"),
    ("shared: both read the total", {"topology": "shared"}, view(1, 30), "base"),
]


@pytest.mark.parametrize(("name", "params", "snapshot", "pool"), CASES, ids=[c[0] for c in CASES])
def test_expected_latency(name: str, params: dict[str, Any], snapshot: View, pool: str) -> None:
    decision = build_policy("expected-latency", params, PROFILE).choose(REQUEST, snapshot)
    assert (decision.pool, decision.reason) == (pool, "expected_latency")


def test_acceptance_crossover_follows_live_accept_length() -> None:
    policy = build_policy("acceptance-crossover", {}, PROFILE)
    measured = policy.describe()["crossover"]
    assert policy.choose(REQUEST, view(0, 0)).pool == "spec"
    assert policy.describe()["crossover"] == measured  # no live value: the profile's
    load = round(measured)  # the request would make load + 1, just past the crossover
    assert policy.choose(REQUEST, view(load, 0, accept=3.0)).pool == "base"
    assert policy.choose(REQUEST, view(load, 0, accept=4.5)).pool == "spec"  # code-like traffic
    assert policy.describe()["crossover"] > measured
    assert policy.describe()["live_accept_length"] == 4.5
    assert policy.choose(REQUEST, view(1, 0, accept=1.2)).pool == "base"  # drafts rejected


def test_an_old_accept_length_is_not_believed() -> None:
    """No verify step for longer than accept_max_age: the value is old news, and the
    profile's crossover applies again."""
    policy = build_policy("acceptance-crossover", {"accept_max_age": 30}, PROFILE)
    assert policy.choose(REQUEST, view(1, 0, accept=1.2, age=29)).pool == "base"
    assert policy.choose(REQUEST, view(1, 0, accept=1.2, age=31)).pool == "spec"
    assert policy.describe()["live_accept_length"] is None


@pytest.mark.parametrize(
    ("name", "accept", "load", "probes"),
    [
        ("kept away by a low accept length: one in fifty probes", 1.2, 1, 2),
        ("kept away by load, not acceptance: no probe", 3.0, 40, 0),
        ("a good accept length speculates anyway: no probe needed", 4.5, 1, 0),
    ],
)
def test_probes_keep_a_shunned_pool_measured(
    name: str, accept: float, load: int, probes: int
) -> None:
    policy = build_policy("acceptance-crossover", {"probe_share": 0.02}, PROFILE)
    reasons = [policy.choose(REQUEST, view(load, 0, accept=accept)).reason for _ in range(100)]
    assert reasons.count("probe") == probes
    assert all(r != "probe" or i % 50 == 49 for i, r in enumerate(reasons))


NO_LEVELS = parse_profile(
    {"schema": "specroute.profile/v1", "crossover": {"value": 3, "ci": [2, 4]}}
)


@pytest.mark.parametrize(
    ("policy", "params", "profile", "message"),
    [
        ("expected-latency", {"hysteresis": 1}, PROFILE, "unknown parameter 'hysteresis'"),
        ("acceptance-crossover", {"crossover": 4}, PROFILE, "unknown parameter 'crossover'"),
        ("expected-latency", {}, NO_LEVELS, "measured 'levels'"),
        ("acceptance-crossover", {}, None, "needs a profile"),
    ],
)
def test_bad_setups_are_refused(
    policy: str, params: dict[str, Any], profile: Profile | None, message: str
) -> None:
    with pytest.raises((PolicyError, ProfileError), match=message):
        build_policy(policy, params, profile)


BANDED_CROSSOVER: dict[str, Any] = {"value": 16.0, "ci": [14.0, 18.0], "bands": [[4, 16], [32, 64]]}
BANDED = {"schema": "specroute.profile/v1", "crossover": BANDED_CROSSOVER}


def test_bands_route_inside_them_with_hysteresis_at_every_edge() -> None:
    """A mixture-of-experts profile: speculation loses below 4, pays from 4 to 16, loses
    again, and pays from 32 to 64; outside a band, a group speculates again only once its
    load is ``hysteresis`` inside one."""
    policy = build_policy("crossover", {"hysteresis": 1}, parse_profile(BANDED))
    pools = [
        policy.choose(REQUEST, view(n - 1, 0)).pool
        for n in (3, 4, 5, 16, 17, 16, 15, 31, 32, 33, 64, 65)
    ]
    assert pools == [
        "base",
        "base",
        "spec",
        "spec",
        "base",
        "base",
        "spec",
        "base",
        "base",
        "spec",
        "spec",
        "base",
    ]
    reasons = {policy.choose(REQUEST, view(n - 1, 0)).reason for n in (10, 20)}
    assert reasons == {"inside_band", "outside_band"}
    assert policy.describe()["bands"] == [[4.0, 16.0], [32.0, 64.0]]


def test_a_profile_without_bands_routes_by_its_one_crossover() -> None:
    profile = parse_profile(
        {"schema": "specroute.profile/v1", "crossover": {"value": 6.0, "ci": [5.0, 7.0]}}
    )
    assert profile.crossover.bands == ((None, 6.0),)
    policy = build_policy("crossover", {}, profile)
    assert [policy.choose(REQUEST, view(n - 1, 0)).reason for n in (6, 7)] == [
        "below_crossover",
        "above_crossover",
    ]


@pytest.mark.parametrize(
    "bands", [[[4, 16], [8, 32]], [[16, 4]], [[None, 4], [None, 8]], [4, 16], "4-16", [[4, 16, 32]]]
)
def test_bands_that_do_not_read_are_refused(bands: Any) -> None:
    with pytest.raises(ProfileError, match="bands"):
        parse_profile(BANDED | {"crossover": BANDED_CROSSOVER | {"bands": bands}})


async def test_the_router_shows_the_bands_it_routes_by(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(BANDED))
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.05") as spec,
        running_emulator("--mode", "base", "--time-scale", "0.05") as base,
        running_router(spec=[spec], base=[base], profile=path) as (url, _),
        aiohttp.ClientSession() as s,
        s.get(f"{url}/metrics") as r,
    ):
        text = await r.text()
    edges = {
        tuple(sorted(m.labels.items())): m.value
        for family in text_string_to_metric_families(text)
        for m in family.samples
        if m.name == "specroute_band_edge"
    }
    assert edges == {
        (("band", "0"), ("edge", "from")): 4,
        (("band", "0"), ("edge", "to")): 16,
        (("band", "1"), ("edge", "from")): 32,
        (("band", "1"), ("edge", "to")): 64,
    }


def _v2(buckets: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema": "specroute.profile/v2",
        "crossover": buckets[0]["crossover"],
        "context": {"tokens_per_byte": 0.25, "buckets": buckets},
    }


def test_a_v2_profile_gives_the_crossover_per_context() -> None:
    """One crossover per bucket: interpolated in log context and log load between them,
    the end buckets' beyond; bands where a bucket has them, the nearer bucket's."""
    profile = parse_profile(
        _v2(
            [
                {"context": 1000, "crossover": {"value": 32.0, "ci": [24, 40]}},
                {"context": 16000, "crossover": {"value": 8.0, "ci": [6, 10]}},
            ]
        )
    )
    axis = profile.context
    assert axis is not None and axis.tokens_per_byte == 0.25
    assert axis.bands_at(500) == ((None, 32.0),) and axis.bands_at(64000) == ((None, 8.0),)
    assert axis.bands_at(4000)[0][1] == pytest.approx(16.0)  # halfway in log: sqrt(32 x 8)
    banded = parse_profile(
        _v2(
            [
                {"context": 1000, "crossover": {"value": 32.0, "ci": [24, 40]}},
                {
                    "context": 16000,
                    "crossover": {
                        "value": None,
                        "ci": None,
                        "bound": "below",
                        "limit": 1,
                        "bands": [[16, 64]],
                    },
                },
            ]
        )
    )
    assert banded.context is not None
    assert banded.context.bands_at(2000) == ((None, 32.0),)
    assert banded.context.bands_at(8000) == ((16.0, 64.0),)
    assert parse_profile(PROFILE.raw).context is None  # v1: no axis


@pytest.mark.parametrize(
    "context",
    [
        None,
        {"buckets": []},
        {"tokens_per_byte": 0.25, "buckets": []},
        {
            "tokens_per_byte": -1,
            "buckets": [{"context": 1, "crossover": {"value": 2, "ci": [1, 3]}}],
        },
        {
            "tokens_per_byte": 0.25,
            "buckets": [
                {"context": 9, "crossover": {"value": 2, "ci": [1, 3]}},
                {"context": 3, "crossover": {"value": 2, "ci": [1, 3]}},
            ],
        },
    ],
)
def test_a_v2_profile_without_a_readable_context_axis_is_refused(context: Any) -> None:
    data = {"schema": "specroute.profile/v2", "crossover": {"value": 2, "ci": [1, 3]}}
    with pytest.raises(ProfileError, match="context"):
        parse_profile(data | ({} if context is None else {"context": context}))


# Curves per context bucket: at 1,000 KV tokens speculation pays up to about 11 requests;
# at 16,000 every step is slower, and speculation only pays alone.
LEVELS_BY_CONTEXT = {
    1000: [(1, 5.0, 10.0), (4, 10.0, 12.0), (16, 30.0, 20.0)],
    16000: [(1, 12.0, 14.0), (4, 40.0, 24.0), (16, 120.0, 60.0)],
}


def _with_curves() -> Profile:
    buckets = [
        {
            "context": c,
            "crossover": {"value": 6.0, "ci": [5, 7]},
            "levels": [lv for lv, _, _ in rows],
            "tpot_ms": {"spec": [s for _, s, _ in rows], "base": [b for _, _, b in rows]},
        }
        for c, rows in LEVELS_BY_CONTEXT.items()
    ]
    raw = PROFILE.raw | {
        "schema": "specroute.profile/v2",
        "context": {"tokens_per_byte": 0.25, "buckets": buckets},
    }
    return parse_profile(raw)


def holding(spec: tuple[int, int], base: tuple[int, int]) -> View:
    """Each server's requests in flight and their estimated KV tokens."""
    return View(
        (
            BackendView("s1", "spec", True, spec[0], kv_tokens=spec[1]),
            BackendView("b1", "base", True, base[0], kv_tokens=base[1]),
        )
    )


SHORT = RequestInfo(path="/v1/chat/completions", prompt_bytes=3200, max_tokens=400)  # 1,000
LONG = RequestInfo(path="/v1/chat/completions", prompt_bytes=63200, max_tokens=400)  # 16,000


def test_curves_per_context_are_linear_in_context() -> None:
    by_context = context_curves(_with_curves())
    assert by_context is not None and by_context.contexts == (1000.0, 16000.0)
    assert by_context.at("spec", 4, 1000) == pytest.approx(0.010)
    assert by_context.at("spec", 4, 8500) == pytest.approx(0.025)  # halfway: 10 and 40 ms
    assert by_context.at("base", 1, 100) == pytest.approx(0.010)  # the end buckets' beyond
    assert by_context.at("base", 1, 64000) == pytest.approx(0.014)
    assert context_curves(PROFILE) is None  # v1
    assert context_curves(_without_curves()) is None  # written before buckets had curves


CONTEXT_CASES: list[tuple[str, RequestInfo, View, str, str]] = [
    ("short, idle pair: the short curves", SHORT, holding((0, 0), (0, 0)), "auto", "spec"),
    ("long, idle pair: the long curves", LONG, holding((0, 0), (0, 0)), "auto", "spec"),
    (
        "long, one on each: spec loses at 16,000",
        LONG,
        holding((3, 48000), (3, 48000)),
        "auto",
        "base",
    ),
    (
        "short joining three long: their mix is long",
        SHORT,
        holding((3, 48000), (3, 3000)),
        "auto",
        "base",
    ),
    (
        "the same, context off: spec at 4 beats base at 4",
        SHORT,
        holding((3, 48000), (3, 3000)),
        "off",
        "spec",
    ),
]


@pytest.mark.parametrize(
    ("name", "request_", "snapshot", "context", "pool"),
    CONTEXT_CASES,
    ids=[c[0] for c in CONTEXT_CASES],
)
def test_expected_latency_at_the_context_mix(
    name: str, request_: RequestInfo, snapshot: View, context: str, pool: str
) -> None:
    profile = _with_curves()
    policy = build_policy("expected-latency", {"context": context}, profile)
    assert request_.context(0.25) in (1000, 16000)
    decision = policy.choose(request_, snapshot)
    assert (decision.pool, decision.reason) == (pool, "expected_latency")


def test_expected_latency_reads_context_only_where_the_profile_has_it() -> None:
    profile = _with_curves()
    assert build_policy("expected-latency", {}, profile).describe()["curve_contexts"] == [
        1000.0,
        16000.0,
    ]
    for params, given in (({"context": "off"}, profile), ({}, PROFILE)):
        policy = build_policy("expected-latency", params, given)
        assert policy.describe()["curve_contexts"] is None
        assert policy.choose(SHORT, holding((3, 48000), (3, 3000))).pool == "spec"
    bad = profile.raw | {
        "context": profile.raw["context"]
        | {"buckets": [profile.raw["context"]["buckets"][0] | {"tpot_ms": {"spec": [1.0]}}]}
    }
    with pytest.raises(ProfileError, match=r"buckets\[0\]"):
        build_policy("expected-latency", {}, parse_profile(bad))
    with pytest.raises(PolicyError, match="context"):
        build_policy("expected-latency", {"context": "on"}, profile)


def _without_curves() -> Profile:
    """The same buckets as written before they carried curves: their crossovers only."""
    raw = _with_curves().raw
    buckets = [
        {"context": b["context"], "crossover": b["crossover"]} for b in raw["context"]["buckets"]
    ]
    return parse_profile(raw | {"context": raw["context"] | {"buckets": buckets}})


@pytest.mark.parametrize(
    ("name", "request_", "snapshot", "pool"),
    [(name, r, s, pool) for name, r, s, context, pool in CONTEXT_CASES if context == "auto"],
    ids=[c[0] for c in CONTEXT_CASES if c[3] == "auto"],
)
def test_context_crossover_on_gpus_of_their_own_goes_where_the_curves_cross(
    name: str, request_: RequestInfo, snapshot: View, pool: str
) -> None:
    """Partitioned, with bucket curves: each server read at its own load and context mix."""
    policy = build_policy("context-crossover", {"topology": "partitioned"}, _with_curves())
    decision = policy.choose(request_, snapshot)
    assert (decision.pool, decision.reason) == (pool, "faster_at_context")


def test_context_crossover_reads_curves_only_on_gpus_of_their_own() -> None:
    """Four short requests on the speculative server, the plain one idle: five is inside the
    band (up to 6) at their mix, so the band rule speculates; on GPUs of their own the idle
    plain server is faster (10 ms a token at one against about 11.9 at five), so the curves
    do not. Shared GPUs, or a profile without bucket curves, keep the band rule."""
    snapshot = holding((4, 4000), (0, 0))
    rules = {
        (topology, name): build_policy("context-crossover", {"topology": topology}, profile)
        for topology in ("shared", "partitioned")
        for name, profile in (("curves", _with_curves()), ("bands", _without_curves()))
    }
    assert {key: p.describe()["rule"] for key, p in rules.items()} == {
        ("shared", "curves"): "bands",
        ("shared", "bands"): "bands",
        ("partitioned", "curves"): "curves",
        ("partitioned", "bands"): "bands",
    }
    decisions = {
        key: (d.pool, d.reason) for key, p in rules.items() for d in [p.choose(SHORT, snapshot)]
    }
    banded = ("spec", "inside_band_at_context")
    assert decisions == {
        ("shared", "curves"): banded,
        ("shared", "bands"): banded,
        ("partitioned", "curves"): ("base", "faster_at_context"),
        ("partitioned", "bands"): banded,
    }
    curves_ = rules["partitioned", "curves"]
    assert curves_.crossover() == 6.0  # the band's edge at the speculative server's mix, shown
    none = View((BackendView("s1", "spec", False, 0), BackendView("b1", "base", False, 0)))
    assert curves_.choose(SHORT, none).reason == "no_healthy_backend"
