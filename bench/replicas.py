"""``specroute bench replicas``: several router replicas in front of the same two servers,
against one router, under the same ramp of closed-loop clients.

Each replica counts only the requests it sent, so with the ``router`` load source R
replicas speculate up to R times the crossover. The ``replicas`` source reads each server's
load from ``/v1/loads`` every poll and brings it up to date with the replica's own requests
since; between polls the other replicas' requests go unseen. This measures how far the
deployment's share of speculative requests then strays from one router's, per number of
replicas and poll interval, level by level. Each run reads the emulators' clocks before
and after (``loadgen.lag``): a run they could not keep time in says so.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from specroute.loadgen import lag
from specroute.loadgen.spawn import NO_DRAIN, spawned


@dataclass(frozen=True)
class ReplicasPlan:
    replicas: tuple[int, ...] = (2, 4)
    polls: tuple[float, ...] = (0.05, 0.25, 1.0)  # seconds
    levels: tuple[int, ...] = (1, 2, 4, 6, 8, 10, 12, 16)  # concurrent clients, in turn
    seconds: float = 2.0  # at each level
    crossover: int = 4
    max_tokens: int = 32
    time_scale: float = 1.0


@dataclass(frozen=True)
class Ramp:
    share: float  # of all requests, sent to the speculative pool
    by_level: list[float]
    request_seconds: float  # mean time of one request, end to end


@dataclass(frozen=True)
class Row:
    replicas: int
    source: str
    poll: float
    ramp: Ramp
    share_off: float  # the deployment's share less one router's
    worst_level_off: float  # the largest difference at one level, either way
    emulator_lag: float | None = None  # the servers' together (``loadgen.lag.overall``)

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


async def ramp(
    urls: Sequence[str], levels: Sequence[int], seconds: float, max_tokens: int = 24
) -> Ramp:
    """Closed-loop clients at each level in turn, client i through ``urls[i % len]``."""
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    by_level: list[float] = []
    spent, answered = 0.0, 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:

        async def client(url: str, until: float, sent: dict[str, int]) -> float:
            took = 0.0
            while time.monotonic() < until:
                started = time.monotonic()
                async with s.post(f"{url}/v1/chat/completions", json=body) as r:
                    await r.read()
                    sent[r.headers["x-specroute-backend"].split(":")[0]] += 1
                took += time.monotonic() - started
            return took

        for level in levels:
            sent = {"spec": 0, "base": 0}
            until = time.monotonic() + seconds
            clients = (client(urls[i % len(urls)], until, sent) for i in range(level))
            spent += sum(await asyncio.gather(*clients))
            answered += sent["spec"] + sent["base"]
            by_level.append(sent["spec"] / max(1, sent["spec"] + sent["base"]))
    return Ramp(_share(by_level, levels), by_level, spent / max(1, answered))


def _share(by_level: Sequence[float], levels: Sequence[int]) -> float:
    """The share over the ramp, each level weighted by its clients (as its requests are)."""
    return sum(s * n for s, n in zip(by_level, levels, strict=True)) / sum(levels)


async def measure_replicas(plan: ReplicasPlan, note: Callable[[str], None]) -> list[Row]:
    scale = ("--time-scale", f"{plan.time_scale:g}")
    async with (
        spawned("emulate", "--mode", "spec", *scale) as spec,
        spawned("emulate", "--mode", "base", *scale) as base,
    ):
        backends = ("--spec", spec.url, "--base", base.url)

        async def run(replicas: int, source: str, poll: float) -> tuple[Ramp, float | None]:
            note(f"{replicas} router(s), load source {source}, poll {poll:g} s")
            load = ("--concurrency-source", source, "--poll-interval", f"{poll:g}")
            flags = ("--policy-param", f"crossover={plan.crossover}", *load)
            async with AsyncExitStack() as stack:
                routers = [
                    await stack.enter_async_context(spawned("serve", *NO_DRAIN, *backends, *flags))
                    for _ in range(replicas)
                ]
                urls = [r.url for r in routers]
                async with aiohttp.ClientSession() as session:
                    before = await lag.clocks(session, [spec.url, base.url])
                    got = await ramp(urls, plan.levels, plan.seconds, plan.max_tokens)
                    behind = lag.overall(before, await lag.clocks(session, [spec.url, base.url]))
            if behind is not None and behind > lag.LIMIT:
                note(f"{replicas} router(s), {source}, poll {poll:g} s: {lag.late(behind)}")
            return got, None if behind is None else round(behind, 4)

        one, behind = await run(1, "router", plan.polls[0])
        rows = [Row(1, "router", plan.polls[0], one, 0.0, 0.0, behind)]
        configs = [(n, "router", plan.polls[0]) for n in plan.replicas[:1]]
        configs += [(n, "replicas", p) for n in plan.replicas for p in plan.polls]
        for replicas, source, poll in configs:
            got, behind = await run(replicas, source, poll)
            worst = max(abs(a - b) for a, b in zip(got.by_level, one.by_level, strict=True))
            rows.append(Row(replicas, source, poll, got, got.share - one.share, worst, behind))
    return rows


def render(rows: Sequence[Row]) -> str:
    lines = [
        "| routers | load source | poll (s) | speculative share | off one router's | "
        "worst level off | emulator lag |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.replicas} | {r.source} | {r.poll:g} | {r.ramp.share:.3f} | "
            f"{r.share_off:+.3f} | {r.worst_level_off:.3f} | {lag.shown(r.emulator_lag)} |"
        )
    mean = rows[0].ramp.request_seconds
    lines.append(f"\none request took {mean:.3f} s on average (one router, end to end)")
    late = [r.emulator_lag for r in rows if r.emulator_lag is not None]
    if late and max(late) > lag.LIMIT:
        lines.append(f"\nNOT KEPT TIME: {lag.late(max(late))}")
    return "\n".join(lines)
