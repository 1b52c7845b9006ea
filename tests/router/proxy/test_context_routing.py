"""Routing by context: each request's context estimated from its body, the KV tokens in
flight per backend, the ``context-crossover`` policy, live and in an offline replay."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specroute.bench.replay import ReplayPlan, replay
from specroute.emulator.config import EmulatorConfig
from specroute.loadgen.dataset import synthetic
from specroute.loadgen.trace import Phase, Trace
from specroute.policies.decision import Decision, PolicyError
from specroute.policies.policy import Policy
from specroute.policies.profile import Profile, parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import (
    MAX_CONTEXT,
    UNSAID_MAX_TOKENS,
    BackendView,
    Pool,
    RequestInfo,
    View,
)
from specroute.router.proxy.request import request_info
from specroute.router.workers.board import Board
from tests.emulator.test_emulator_api import client
from tests.emulators import emulator_config, running_emulator
from tests.profiler.test_bench import run
from tests.routers import running_router

# speculation pays up to 32 concurrent requests of 1,000 KV tokens, up to 8 of 16,000
V2: dict[str, Any] = {
    "schema": "specroute.profile/v2",
    "crossover": {"value": 32.0, "ci": [28, 36]},
    "context": {
        "tokens_per_byte": 0.25,
        "buckets": [
            {"context": 1000, "crossover": {"value": 32.0, "ci": [28, 36]}},
            {"context": 16000, "crossover": {"value": 8.0, "ci": [7, 9]}},
        ],
    },
}
PROFILE = parse_profile(V2)
CHAT = "/v1/chat/completions"

# 1. The estimate, from each API's body


@pytest.mark.parametrize(
    ("name", "path", "body", "text", "ids", "max_tokens"),
    [
        (
            "chat, string content",
            CHAT,
            {
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "hello"},
                ],
                "max_tokens": 64,
            },
            13,
            0,
            64,
        ),
        (
            "chat, a list of parts: text counts, an image not",
            CHAT,
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "what is"},
                            {
                                "type": "image_url",
                                "image_url": {"url": "data:image/png;base64,AAAA"},
                            },
                            {"type": "text", "text": " this?"},
                        ],
                    }
                ],
                "max_completion_tokens": 9,
            },
            13,
            0,
            9,
        ),
        (
            "chat, UTF-8 bytes not characters",
            CHAT,
            {"messages": [{"role": "user", "content": "héllo 世界"}]},
            13,
            0,
            None,
        ),
        (
            "chat, a lone surrogate (JSON allows it)",
            CHAT,
            {"messages": [{"role": "user", "content": "a\ud800"}]},
            4,
            0,
            None,
        ),
        (
            "chat, no content, odd messages",
            CHAT,
            {"messages": [{"role": "assistant", "tool_calls": []}, "junk", {"content": 7}]},
            0,
            0,
            None,
        ),
        (
            "completions, a string",
            "/v1/completions",
            {"prompt": "once upon", "max_tokens": 5},
            9,
            0,
            5,
        ),
        (
            "completions, a batch of strings",
            "/v1/completions",
            {"prompt": ["ab", "cde"]},
            5,
            0,
            None,
        ),
        ("completions, token ids", "/v1/completions", {"prompt": [1, 2, 3, 4]}, 0, 4, None),
        (
            "completions, batches of token ids",
            "/v1/completions",
            {"prompt": [[1, 2], [3]]},
            0,
            3,
            None,
        ),
        (
            "generate, text",
            "/generate",
            {"text": "the sky", "sampling_params": {"max_new_tokens": 32}},
            7,
            0,
            32,
        ),
        ("generate, input ids", "/generate", {"input_ids": [5, 6, 7]}, 0, 3, None),
        ("nothing to read", CHAT, {}, 0, 0, None),
        (
            "a prompt of the wrong type",
            "/v1/completions",
            {"prompt": 42, "max_tokens": "9"},
            0,
            0,
            None,
        ),
    ],
)
def test_the_estimate_reads_each_api_shape(
    name: str, path: str, body: dict[str, Any], text: int, ids: int, max_tokens: int | None
) -> None:
    info = request_info(path, body)
    assert (info.prompt_bytes, info.prompt_tokens, info.max_tokens) == (text, ids, max_tokens)
    half = (UNSAID_MAX_TOKENS if max_tokens is None else max_tokens) // 2
    assert info.context(0.25) == round(text * 0.25) + ids + half
    assert info.tokens(0.25) == (round(text * 0.25) + ids, info.context(0.25))  # its prompt


def test_the_estimate_is_never_negative_nor_past_any_model() -> None:
    info = request_info(CHAT, {"messages": [], "max_tokens": -500})
    assert info.context(0.25) == 0
    assert RequestInfo(CHAT, max_tokens=0, prompt_bytes=4000).context(0.25) == 1000
    huge = request_info(CHAT, {"messages": [], "max_tokens": 10**300})  # JSON allows it
    assert huge.context(0.25) == MAX_CONTEXT  # the board's 64-bit sums cannot overflow
    long = RequestInfo(CHAT, prompt_bytes=1 << 40, prompt_tokens=1 << 40)
    assert long.tokens(0.25) == (MAX_CONTEXT, MAX_CONTEXT)


# 2. The KV tokens in flight, on the board every worker shares


def test_every_worker_sees_the_kv_tokens_of_all() -> None:
    board = Board(workers=2, backends=2)
    board.add_inflight(0, 1, 500)
    board.become(1)
    board.add_inflight(0, 2, 300)
    board.add_inflight(1, 1, 70)
    assert (board.inflight(0), board.kv_tokens(0), board.kv_tokens(1)) == (3, 800, 70)
    board.add_inflight(0, -1, -100)
    assert board.kv_tokens(0) == 700
    board.forget(0)  # worker 0 died with its requests
    assert (board.inflight(0), board.kv_tokens(0)) == (1, 200)


# 3. The policy


def request(context: int) -> RequestInfo:
    """A request of exactly ``context`` KV tokens: its prompt, no output."""
    return RequestInfo(CHAT, max_tokens=0, prompt_bytes=context * 4)


def view(spec: tuple[int, int], base: tuple[int, int] = (0, 0)) -> View:
    """Requests in flight and their KV tokens, on each pool's server of one GPU group."""
    return View(
        (
            BackendView("s1", "spec", True, spec[0], kv_tokens=spec[1]),
            BackendView("b1", "base", True, base[0], kv_tokens=base[1]),
        )
    )


CASES: list[tuple[str, dict[str, Any], View, int, str]] = [
    ("12 short ones: speculate", {}, view((12, 12 * 1000)), 1000, "spec"),
    ("12 long ones: do not", {}, view((12, 12 * 16000)), 16000, "base"),
    (
        "12 long ones, a short request joins: the mix is still long",
        {},
        view((12, 12 * 16000)),
        1000,
        "base",
    ),
    ("idle, a long request", {}, view((0, 0)), 16000, "spec"),
    ("7 long ones: the 8th is at the crossover", {}, view((7, 7 * 16000)), 16000, "spec"),
    ("8 long ones: past it", {}, view((8, 8 * 16000)), 16000, "base"),
    ("40 short ones: past 32", {}, view((40, 40 * 1000)), 1000, "base"),
    ("15 of 4,000 (crossover 16, halfway in log)", {}, view((15, 15 * 4000)), 4000, "spec"),
    ("16 of 4,000", {}, view((16, 16 * 4000)), 4000, "base"),
    (
        "shared: the plain server's long ones count in the mix",
        {},
        view((6, 6 * 1000), (6, 6 * 16000)),
        1000,
        "base",
    ),
    (
        "partitioned: only the speculative server's",
        {"topology": "partitioned"},
        view((6, 6 * 1000), (6, 6 * 16000)),
        1000,
        "spec",
    ),
]


@pytest.mark.parametrize(
    ("name", "params", "snapshot", "context", "pool"), CASES, ids=[c[0] for c in CASES]
)
def test_the_policy_reads_the_crossover_at_the_context_mix(
    name: str, params: dict[str, Any], snapshot: View, context: int, pool: str
) -> None:
    decision = build_policy("context-crossover", params, PROFILE).choose(request(context), snapshot)
    reason = "inside_band_at_context" if pool == "spec" else "outside_band_at_context"
    assert (decision.pool, decision.reason) == (pool, reason)


def test_hysteresis_at_the_edge_and_the_crossover_of_the_last_mix() -> None:
    policy = build_policy("context-crossover", {"hysteresis": 2}, PROFILE)
    assert policy.crossover() is None  # no decision yet
    pools = [
        policy.choose(request(1000), view((n - 1, (n - 1) * 1000))).pool
        for n in (32, 33, 31, 30, 32)
    ]
    assert pools == ["spec", "base", "base", "spec", "spec"]
    assert policy.crossover() == 32.0
    policy.choose(request(16000), view((0, 0)))
    assert policy.crossover() == 8.0
    described = policy.describe()
    assert described["buckets"] == [
        {"context": 1000.0, "bands": [[None, 32.0]]},
        {"context": 16000.0, "bands": [[None, 8.0]]},
    ]
    assert described["context_mix"] == 16000 and described["topology"] == "shared"


V1 = parse_profile({"schema": "specroute.profile/v1", "crossover": {"value": 4, "ci": [3, 5]}})


@pytest.mark.parametrize(
    ("params", "profile", "message"),
    [
        ({}, None, "needs a profile with a context axis.*none was given"),
        ({}, V1, "needs a profile with a context axis.*this one has none"),
        ({"crossover": 4}, PROFILE, "'context-crossover': unknown parameter 'crossover'"),
        ({"hysteresis": -1}, PROFILE, "'context-crossover'.*hysteresis must be >= 0"),
        ({"topology": "mesh"}, PROFILE, "'context-crossover'.*topology='mesh'"),
    ],
)
def test_bad_setups_are_refused(
    params: dict[str, Any], profile: Profile | None, message: str
) -> None:
    with pytest.raises(PolicyError, match=message):
        build_policy("context-crossover", params, profile)


# 4. Live: a router process, the official client


async def gauge(url: str, name: str, label: str) -> dict[str, float]:
    """One gauge of the router's ``/metrics``, by one of its labels."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    return {
        m.labels[label]: m.value
        for family in text_string_to_metric_families(text)
        for m in family.samples
        if m.name == name
    }


async def kv_gauge(url: str) -> dict[str, float]:
    """``specroute_kv_tokens_inflight`` by backend."""
    return await gauge(url, "specroute_kv_tokens_inflight", "backend")


async def drained(url: str, seconds: float = 5.0) -> dict[str, float]:
    """The gauge once every request has ended (a cancellation lands a moment later)."""
    for _ in range(int(seconds / 0.02)):
        gauge = await kv_gauge(url)
        if not any(gauge.values()):
            return gauge
        await asyncio.sleep(0.02)
    return await kv_gauge(url)


SHORT, LONG = "hi", "word " * 8000  # 2 and 40,000 bytes: 0 and 10,000 tokens at 0.25


async def test_kv_tokens_in_flight_go_up_and_back_to_zero(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(V2))
    slow = ("--time-scale", "0.5")  # 300 tokens take about 2.5 s: long enough to be seen
    async with (
        running_emulator("--mode", "spec", *slow) as spec,
        running_emulator("--mode", "base", *slow) as base,
        running_router(spec=[spec], base=[base], profile=path, policy="context-crossover") as (
            url,
            _,
        ),
    ):
        c = client(url)

        async def stream(prompt: str) -> openai.AsyncStream[Any]:
            return await c.chat.completions.create(
                model="m",
                messages=[{"role": "user", "content": prompt}],
                max_tokens=300,
                stream=True,
                extra_body={"ignore_eos": True},
            )

        streams = [await stream(p) for p in (SHORT, LONG, SHORT, LONG)]
        during = await kv_gauge(url)
        assert sum(during.values()) == 2 * (0 + 150) + 2 * (10000 + 150)
        async with aiohttp.ClientSession() as s, s.get(f"{url}/router/status") as r:
            status = await r.json()
        assert [b["kv_tokens_inflight"] for b in status["backends"]] == list(during.values())
        measured = await gauge(url, "specroute_profile_context_tokens", "bucket")
        assert measured == {"0": 1000, "1": 16000}  # the buckets' contexts, for the dashboard
        assert status["profile"]["contexts"] == [1000, 16000]
        parameters = status["policy"]["parameters"]
        assert status["policy"]["name"] == "context-crossover"
        assert [b["context"] for b in parameters["buckets"]] == [1000, 16000]
        for each in streams:
            async for _ in each:
                pass
        assert set((await drained(url)).values()) == {0}

        left = await stream(LONG)  # the client goes away mid-stream
        async for _ in left:
            break
        assert sum((await kv_gauge(url)).values()) == 10150
        await left.close()
        assert set((await drained(url)).values()) == {0}

        with pytest.raises(openai.BadRequestError):  # the backend refuses: an answer too
            await c.chat.completions.create(
                model="m", messages=[{"role": "user", "content": LONG}], max_tokens=10**6
            )
        assert set((await drained(url)).values()) == {0}


async def test_a_retried_request_leaves_no_kv_tokens_behind(tmp_path: Path) -> None:
    """The speculative server is busy (503 before any byte): retried on the plain one."""
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(V2))
    fast = ("--time-scale", "0.05")
    async with (
        running_emulator("--mode", "spec", *fast, "--fault", "status:503") as spec,
        running_emulator("--mode", "base", *fast) as base,
        running_router(spec=[spec], base=[base], profile=path, policy="context-crossover") as (
            url,
            state,
        ),
    ):
        raw = await client(url).chat.completions.with_raw_response.create(
            model="m", messages=[{"role": "user", "content": LONG}], max_tokens=4
        )
        assert raw.headers["x-specroute-backend"].startswith("base:")
        assert [d["reason"] for d in state.decisions.recent] == ["inside_band_at_context", "retry"]
        assert set((await drained(url)).values()) == {0}


async def test_expected_latency_reads_the_context_live(tmp_path: Path) -> None:
    """With curves per context bucket, the router's estimate of each request's context
    decides: on an idle pair a short prompt speculates (the short curves) and a long one
    does not (the long curves), where the top-level curves alone speculate for both."""
    rows = {1000: ([5.0, 8.0], [10.0, 12.0]), 16000: ([20.0, 30.0], [14.0, 18.0])}
    buckets = [
        {
            "context": c,
            "crossover": {"value": 2.0, "ci": [1, 3]},
            "levels": [1, 4],
            "tpot_ms": {"spec": spec, "base": base},
        }
        for c, (spec, base) in rows.items()
    ]
    top = ((1, 5.0, 10.0), (4, 8.0, 12.0))  # the short bucket's, as calibration writes it
    levels = [
        {"concurrency": c, "spec": {"tpot_ms": {"median": s}}, "base": {"tpot_ms": {"median": b}}}
        for c, s, b in top
    ]
    path = tmp_path / "profile.json"
    path.write_text(
        json.dumps(V2 | {"levels": levels, "context": V2["context"] | {"buckets": buckets}})
    )
    fast = ("--time-scale", "0.05")
    for context, pools in (("auto", ["spec", "base"]), ("off", ["spec", "spec"])):
        async with (
            running_emulator("--mode", "spec", *fast) as spec,
            running_emulator("--mode", "base", *fast) as base,
            running_router(
                spec=[spec], base=[base], profile=path, policy="expected-latency", context=context
            ) as (url, state),
        ):
            served = []
            for prompt in (SHORT, LONG):
                raw = await client(url).chat.completions.with_raw_response.create(
                    model="m", messages=[{"role": "user", "content": prompt}], max_tokens=4
                )
                served.append(raw.headers["x-specroute-backend"].split(":")[0])
            assert served == pools, context
            assert [d["reason"] for d in state.decisions.recent] == ["expected_latency"] * 2
            described = state.in_force.policy.describe()["curve_contexts"]
            assert described == (None if context == "off" else [1000.0, 16000.0])


# 5. Offline: the same view in virtual time


class Watched:
    """The policy, with every view it was shown."""

    def __init__(self, policy: Policy) -> None:
        self.policy, self.name, self.views = policy, policy.name, list[View]()

    def choose(self, request: RequestInfo, view: View) -> Decision:
        self.views.append(view)
        return self.policy.choose(request, view)

    def crossover(self) -> float | None:
        return self.policy.crossover()

    def describe(self) -> dict[str, Any]:
        return self.policy.describe()


def test_an_offline_replay_routes_by_context() -> None:
    servers: dict[Pool, EmulatorConfig] = {
        pool: emulator_config("--mode", pool, "--max-running-requests", "256")
        for pool in ("spec", "base")
    }
    plan = ReplayPlan(
        Trace("steps", (Phase(5.0, 2), Phase(5.0, 48))),
        synthetic(2000, 64),
        servers,
        backends={"spec": ("http://spec:1",), "base": ("http://base:2",)},
    )
    policy = build_policy("context-crossover", {}, PROFILE)
    watched = Watched(policy)
    records = replay(plan, policy)
    assert {r.served_by for r in records} == {"spec:spec:1", "base:base:2"}
    assert policy.describe()["context_mix"] > 1000  # a 2,000-word prompt: not short
    replay(plan, watched)
    loaded = [b for v in watched.views for b in v.backends if b.inflight]
    assert loaded and all(b.kv_tokens > b.inflight * 32 for b in loaded)  # half of 64 at least
    assert all(b.kv_tokens == 0 for v in watched.views for b in v.backends if not b.inflight)


async def test_bench_compare_offline_runs_context_crossover(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(V2))
    code, _, stderr = await run(
        "bench",
        "compare",
        "--offline",
        "--profile",
        str(path),
        "--trace",
        "steps",
        "--peak",
        "48",
        "--phase-seconds",
        "2",
        "--policies",
        "context-crossover",
        "--time-scale",
        "0.1",
        "--max-running-requests",
        "256",
        "--input-len",
        "2000",
        "--output-len",
        "64",
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 0, stderr
    results = json.loads((tmp_path / "out" / "compare.json").read_text())
    ran = results["policies"]["context-crossover"]["overall"]
    assert ran["requests"] > 0 and 0 < ran["spec_share"] < 1
