"""``specroute bench calls``: the Python function calls a request costs the router, on this
code and on another version's (``--baseline DIR``), counted by ``cProfile``.

CPU per request on one core moves by several percent from one window to the next (timers,
the background polls, the kernel's scheduling); the calls a request makes do not: the same
code path is the same count. So a change that should cost nothing (moving files, cutting
seams) is shown to cost nothing by equal counts, where the CPU figures of ``bench overhead``
can only say that the difference is within their noise.

Each router runs under ``python -m cProfile`` in front of the overhead bench's stub
backends, one worker, its defaults otherwise (as ``bench overhead`` runs ``specroute-w1``).
A count of N requests includes the router's start and its background work; so each version
runs twice, with N and with 2N requests at a fixed concurrency, and a request's calls are
the difference over N. The functions are compared by name (their modules moved): those
called more often, and less, per request."""

from __future__ import annotations

import asyncio
import pstats
import re
import tempfile
from collections import Counter
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from specroute.bench.overhead_targets import start_backends
from specroute.loadgen.spawn import NO_DRAIN, spawned

VERSIONS = ("this", "baseline")
MODES = ("stream", "whole")
SHOWN = 10  # functions listed each way
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


@dataclass(frozen=True)
class CallPlan:
    baseline: str  # a folder holding another specroute (pip install --target)
    requests: int = 2000  # the smaller run's; the larger sends twice as many
    concurrency: int = 64
    modes: tuple[str, ...] = MODES
    chunks: int = 16
    gap_ms: float = 20.0

    def __post_init__(self) -> None:
        if not (Path(self.baseline) / "specroute").is_dir():
            raise ValueError(
                f"{self.baseline} holds no specroute: pip install --target "
                f"{self.baseline} --no-deps of the version to compare against"
            )
        if not set(self.modes) <= set(MODES) or not self.modes:
            raise ValueError(f"modes among {', '.join(MODES)}")


async def count_calls(plan: CallPlan, note: Callable[[str], None]) -> dict[str, Any]:
    """Per mode, each version's calls per request and the functions whose counts differ."""
    modes: dict[str, Any] = {}
    async with AsyncExitStack() as stack:
        backends = await start_backends(stack, plan.chunks, plan.gap_ms)
        first, second = backends.urls
        spread = ("--spec", first, "--spec", second, "--base", backends.idle)
        for mode in plan.modes:
            by_name: dict[str, Counter[str]] = {}
            for version in VERSIONS:
                runs = [
                    await _run(plan, spread, mode, version, n)
                    for n in (plan.requests, 2 * plan.requests)
                ]
                by_name[version] = Counter(runs[1])
                by_name[version].subtract(runs[0])
                per = by_name[version].total() / plan.requests
                note(f"{mode}, {version}: {per:.1f} calls a request")
            this, other = (by_name[v] for v in VERSIONS)
            moved = Counter(this)
            moved.subtract(other)
            ranked = sorted(moved.items(), key=lambda kv: kv[1])
            per_request = [(name, round(n / plan.requests, 2)) for name, n in ranked if n]
            calls = {v: by_name[v].total() / plan.requests for v in VERSIONS}
            modes[mode] = {
                **calls,
                "ratio": calls["this"] / calls["baseline"],
                "more": per_request[::-1][:SHOWN],
                "fewer": per_request[:SHOWN],
            }
    return {
        "plan": {
            "requests": plan.requests,
            "concurrency": plan.concurrency,
            "chunks": plan.chunks,
            "gap_ms": plan.gap_ms,
            "baseline": Path(plan.baseline).name,
        },
        "modes": modes,
    }


async def _run(
    plan: CallPlan, spread: tuple[str, ...], mode: str, version: str, requests: int
) -> Counter[str]:
    """One router's calls by function name over its life, ``requests`` sent."""
    baseline = plan.baseline if version == "baseline" else None
    with tempfile.TemporaryDirectory() as folder:
        out = str(Path(folder) / "calls.prof")
        flags = ("serve", *NO_DRAIN, "--drain-timeout", "1", "--no-access-log")
        async with spawned(
            "-o",
            out,
            "-m",
            "specroute",
            *flags,
            "--policy-param",
            "crossover=1e9",
            *spread,
            "--workers",
            "1",
            module="cProfile",
            ready="/ready",
            path=baseline,
        ) as router:
            await _send(router.url, mode, requests, plan.concurrency)
        stats: Any = pstats.Stats(out)
    counted: Counter[str] = Counter()
    for (_, _, function), (_, calls, *_) in stats.stats.items():
        counted[_ADDRESS.sub("", function)] += calls  # a built-in's address is its process's
    return counted


async def _send(url: str, mode: str, requests: int, concurrency: int) -> None:
    """``requests`` chat completions, ``concurrency`` at a time, each read to its end."""
    body = {
        "model": "stub",
        "messages": [{"role": "user", "content": "count"}],
        "max_tokens": 16,
        "stream": mode == "stream",
    }
    left = iter(range(requests))

    async def client(session: aiohttp.ClientSession) -> None:
        for _ in left:
            async with session.post(f"{url}/v1/chat/completions", json=body) as r:
                await r.read()
                if r.status != 200:
                    raise RuntimeError(f"the router answered {r.status}: {await r.text()}")

    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))


def render(document: dict[str, Any]) -> str:
    lines = [f"calls a request (this code and {document['plan']['baseline']}, one worker):"]
    for mode, row in document["modes"].items():
        lines.append(
            f"  {mode}: {row['this']:.1f} against {row['baseline']:.1f} ({row['ratio']:.3f}x)"
        )
        for way in ("more", "fewer"):
            shown = ", ".join(
                f"{name} {n:+g}" for name, n in row[way] if (n > 0) == (way == "more")
            )
            if shown:
                lines.append(f"    {way}: {shown}")
    return "\n".join(lines)
