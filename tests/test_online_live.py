"""Online calibration in a running router: the official openai client through the router to
two emulators, the samples taken at each request's end, the fit shown on the status page and
in the metrics."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from specroute.router.online_task import fit_now
from tests.emulators import running_emulator
from tests.routers import running_router
from tests.test_emulator_api import CHAT, client

FAST = ("--time-scale", "0.05")


@pytest.fixture
async def backends() -> AsyncIterator[tuple[str, str]]:
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
    ):
        yield spec, base


async def streamed(url: str, usage: bool) -> None:
    stream = await client(url).chat.completions.create(
        model="m",
        messages=CHAT,
        max_tokens=48,
        stream=True,
        stream_options={"include_usage": usage},
    )
    async for _ in stream:
        pass


async def test_streams_that_say_their_usage_become_samples_of_the_load_they_joined(
    backends: tuple[str, str],
) -> None:
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=2.5) as (url, state):
        assert str(state.online.mode) == "observe"  # the default
        await asyncio.gather(*(streamed(url, usage=True) for _ in range(6)))
        await streamed(url, usage=False)  # no usage: no token count, no sample
        await client(url).chat.completions.create(model="m", messages=CHAT, max_tokens=12)
        samples = state.online.samples.window(time.monotonic())
        assert len(samples) == 6
        assert {s.pool for s in samples} == {"spec", "base"}  # six at once: past 2.5
        assert max(s.load for s in samples) >= 3 and min(s.load for s in samples) == 1
        assert all(0 < s.tpot < 1 for s in samples)
        fit_now(state)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/router/status") as r:
                online = (await r.json())["online"]
            async with s.get(f"{url}/metrics") as r:
                metrics = await r.text()
        assert online["mode"] == "observe" and online["samples"] == 6
        assert online["adopted_crossover"] is None
        levels = online["fits"][0]["levels"]
        assert sum(row["samples"] for rows in levels.values() for row in rows) == 6
        assert 'specroute_online_samples{bucket="0",level="1",pool="spec"}' in metrics
        assert "specroute_profile_drift{" in metrics
        assert "specroute_online_adopted 0.0" in metrics


async def test_online_off_records_nothing(backends: tuple[str, str]) -> None:
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=8, online="off") as (url, state):
        await streamed(url, usage=True)
        assert len(state.online.samples) == 0
