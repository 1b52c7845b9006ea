"""``specroute bench affinity``: placement within a pool, least load against prefix
affinity, under chat traffic that shares a few system prompts.

Two speculative and two plain emulated servers, each with a radix cache too small for
every system prompt, behind one router routing by the crossover; the same requests at the
same moments (Poisson arrivals from the seed) with each placement, on fresh servers each
time. What a user sees is measured at the client: the time to the first token, the share
of prompt tokens the servers found cached (the usage's ``cached_tokens``), and the share
sent to the speculative pool. With prefix affinity, how many system prompts the hash gave
each speculative server is reported beside them: it is set by the servers' names, and a
server given more than its cache holds finds few of them cached.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from specroute.loadgen import lag
from specroute.loadgen.spawn import NO_DRAIN, spawned
from specroute.policies.decision import Decision
from specroute.policies.placement import PrefixAffinity
from specroute.policies.view import BackendView, ConcurrencySource, View
from specroute.router.backends.backend import backend_name
from specroute.router.proxy.request import request_info

PLACEMENTS = ("least-load", "prefix-affinity")
_CHAT = "/v1/chat/completions"
_WORDS = [
    "the",
    "model",
    "serves",
    "each",
    "request",
    "through",
    "a",
    "batch",
    "of",
    "tokens",
    "while",
    "the",
    "queue",
    "holds",
    "the",
    "rest",
    "and",
    "every",
    "step",
    "of",
    "decode",
    "reads",
    "the",
    "cache",
    "of",
    "keys",
    "and",
    "values",
    "for",
    "the",
    "prompt",
]


@dataclass(frozen=True)
class AffinityPlan:
    system_prompts: int = 8
    system_words: int = 1200  # a word is a token to the emulator
    cache_tokens: int = 5000  # each server's radix cache: about four system prompts
    requests: int = 400
    rate: float = 5.0  # requests a second of modelled time, arriving as a Poisson process
    crossover: int = 3  # per speculative server (the partitioned topology)
    max_tokens: int = 32
    time_scale: float = 0.2
    hardware: str = "kimi-k2.5-8x-pcie"
    seed: int = 0

    @property
    def wall_rate(self) -> float:
        return self.rate / self.time_scale

    def emulator_flags(self) -> tuple[str, ...]:
        return (
            "--hardware",
            self.hardware,
            "--time-scale",
            f"{self.time_scale:g}",
            "--radix-cache-tokens",
            str(self.cache_tokens),
            "--enable-cache-report",
        )


@dataclass(frozen=True)
class Sample:
    backend: str
    ttft: float  # seconds to the first content chunk
    prompt_tokens: int
    cached_tokens: int


@dataclass(frozen=True)
class Result:
    placement: str
    requests: int
    spec_share: float
    hit_rate: float  # cached prompt tokens over prompt tokens
    ttft_mean: float
    ttft_p50: float
    ttft_p90: float
    by_backend: dict[str, int]
    emulator_lag: float | None = None  # the servers' together (``loadgen.lag.overall``)
    split: list[int] | None = None  # the system prompts the hash gives each spec server

    @classmethod
    def of(
        cls,
        placement: str,
        samples: Sequence[Sample],
        emulator_lag: float | None = None,
        split: Sequence[int] | None = None,
    ) -> Result:
        ttfts = sorted(s.ttft for s in samples)
        prompt = sum(s.prompt_tokens for s in samples)
        served = Counter(s.backend for s in samples)
        spec = sum(n for b, n in served.items() if b.startswith("spec:"))
        return cls(
            placement,
            len(samples),
            spec / max(1, len(samples)),
            sum(s.cached_tokens for s in samples) / max(1, prompt),
            statistics.fmean(ttfts),
            ttfts[len(ttfts) // 2],
            ttfts[int(len(ttfts) * 0.9)],
            dict(sorted(served.items())),
            None if emulator_lag is None else round(emulator_lag, 4),
            None if split is None else list(split),
        )

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def chats(plan: AffinityPlan) -> list[dict[str, Any]]:
    """The requests: a system prompt drawn from a few, and a question of the request's own."""
    rng = random.Random(plan.seed)
    systems = [
        f"You are assistant {i}. " + " ".join(rng.choices(_WORDS, k=plan.system_words))
        for i in range(plan.system_prompts)
    ]
    return [
        {
            "model": "default",
            "messages": [
                {"role": "system", "content": rng.choice(systems)},
                {"role": "user", "content": f"Question {k}: " + " ".join(rng.choices(_WORDS, k=8))},
            ],
            "max_tokens": plan.max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for k in range(plan.requests)
    ]


def split(bodies: Sequence[dict[str, Any]], names: Sequence[str]) -> list[int]:
    """How many of the chats' distinct system prompts prefix affinity's hash gives each of
    the servers ``names``, in their order. Set by the names: few prompts can split unevenly."""
    affinity = PrefixAffinity()
    view = View(tuple(BackendView(n, "spec", True, 0) for n in names), ConcurrencySource.ROUTER)
    policy_pick = Decision("spec", names[0], "below_crossover")
    homes = Counter(
        affinity.place(policy_pick, request_info(_CHAT, b, affinity.prefix_bytes), view)[0].backend
        for b in {b["messages"][0]["content"]: b for b in bodies}.values()
    )
    return [homes[n] for n in names]


async def play(url: str, bodies: Sequence[dict[str, Any]], rate: float, seed: int) -> list[Sample]:
    """The requests through the router at ``url`` in order, arriving at ``rate`` a second
    (a Poisson process drawn from ``seed``: the same arrivals for every placement)."""
    rng = random.Random(seed)
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        tasks = []
        due = time.monotonic()
        for body in bodies:
            due += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            tasks.append(asyncio.create_task(_one(s, url, body)))
        return list(await asyncio.gather(*tasks))


async def _one(s: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Sample:
    started = time.monotonic()
    first: float | None = None
    usage: dict[str, Any] = {}
    async with s.post(f"{url}{_CHAT}", json=body) as r:
        r.raise_for_status()
        backend = r.headers["x-specroute-backend"]
        async for line in r.content:
            data = line.decode().strip().removeprefix("data: ")
            if not data.startswith("{"):
                continue
            chunk = json.loads(data)
            if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                first = time.monotonic()
            usage = chunk.get("usage") or usage
    details = usage.get("prompt_tokens_details") or {}
    return Sample(
        backend,
        (first or time.monotonic()) - started,
        int(usage.get("prompt_tokens", 0)),
        int(details.get("cached_tokens", 0)),
    )


async def measure_affinity(plan: AffinityPlan, note: Callable[[str], None]) -> list[Result]:
    bodies = chats(plan)
    results = []
    for placement in PLACEMENTS:
        note(f"{placement}: {plan.requests} chats at {plan.rate:g} a second")
        async with AsyncExitStack() as stack:
            servers = {
                mode: [
                    await stack.enter_async_context(
                        spawned("emulate", "--mode", mode, *plan.emulator_flags())
                    )
                    for _ in range(2)
                ]
                for mode in ("spec", "base")
            }
            backends = [f"--{m}={s.url}" for m, pair in servers.items() for s in pair]
            router = await stack.enter_async_context(
                spawned(
                    "serve",
                    *NO_DRAIN,
                    *backends,
                    "--policy-param",
                    f"crossover={plan.crossover}",
                    "--policy-param",
                    "topology=partitioned",
                    "--placement",
                    placement,
                )
            )
            urls = [s.url for pair in servers.values() for s in pair]
            names = [backend_name(s.url, "spec") for s in servers["spec"]]
            hashed = split(bodies, names) if placement == "prefix-affinity" else None
            async with aiohttp.ClientSession() as session:
                before = await lag.clocks(session, urls)
                samples = await play(router.url, bodies, plan.wall_rate, plan.seed)
                behind = lag.overall(before, await lag.clocks(session, urls))
            if behind is not None and behind > lag.LIMIT:
                note(f"{placement}: {lag.late(behind)}")
            results.append(Result.of(placement, samples, behind, hashed))
    return results


def render(results: Sequence[Result]) -> str:
    lines = [
        "| placement | cache hit rate | TTFT mean (s) | TTFT p50 | TTFT p90 | speculative share "
        "| system prompts per speculative server (hash) | emulator lag |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.placement} | {r.hit_rate:.1%} | {r.ttft_mean:.3f} | {r.ttft_p50:.3f} | "
            f"{r.ttft_p90:.3f} | {r.spec_share:.1%} | {shown_split(r.split)} | "
            f"{lag.shown(r.emulator_lag)} |"
        )
    behind = [r.emulator_lag for r in results if r.emulator_lag is not None]
    if behind and max(behind) > lag.LIMIT:
        lines.append(f"\nNOT KEPT TIME: {lag.late(max(behind))}")
    return "\n".join(lines)


def shown_split(split: Sequence[int] | None) -> str:
    """The hash's split as a table shows it: ``4 / 4``, and - for least load."""
    return "-" if split is None else " / ".join(str(n) for n in split)
