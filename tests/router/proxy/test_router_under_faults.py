"""Each fault the emulator injects, as a client of the router sees it: retried transparently
before the first byte, an OpenAI-shaped error after it, never a silent truncation nor a
hang past the timeouts; traffic leaves a failing pool and comes back when it recovers; and
every in-flight count ends at exactly 0."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest

from specroute.loadgen.spawn import spawned
from specroute.router.state import RouterState
from tests.emulator.test_emulator_api import CHAT
from tests.emulators import FAST, running_emulator
from tests.router.proxy.test_router import settled
from tests.routers import running_router

IDLE = 0.5  # the router's idle timeout for streams, and the deadline of a whole answer


@asynccontextmanager
async def faulty(*faults: str) -> AsyncIterator[tuple[str, RouterState]]:
    """A router in front of a speculative emulator and a healthy plain one; once the router
    has found both healthy, the speculative one gets ``faults``. The crossover sends
    everything to it first."""
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(
            spec=[spec],
            base=[base],
            crossover=100,
            idle_timeout=IDLE,
            request_timeout=IDLE,
            eject_after_failures=100,
        ) as (url, state),
        aiohttp.ClientSession() as s,
    ):
        async with s.post(f"{spec}/emulator/faults", json={"faults": list(faults)}) as r:
            assert r.status == 200, await r.text()
        yield url, state
        await settled(state)
        assert state.inflight() == 0


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def _ask(url: str, stream: bool) -> tuple[str, str]:
    """The text of a 20-token answer and the backend that served it; errors propagate."""
    async with _client(url) as c:
        raw = await c.chat.completions.with_raw_response.create(
            model="m",
            messages=CHAT,
            max_tokens=20,
            stream=stream,
            extra_body={"ignore_eos": True},
        )
        served = raw.headers["x-specroute-backend"]
        answer: Any = raw.parse()
        if not stream:
            return answer.choices[0].message.content, served
        text = ""
        async for chunk in answer:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
        return text, served


RETRIED = [  # (fault, stream): the answer comes whole from the plain pool, as if nothing happened
    ("refuse", True),
    ("refuse", False),
    ("status:503", False),
    ("cut_mid:0", True),  # headers, then the connection closes before any event
]


@pytest.mark.parametrize(("fault", "stream"), RETRIED, ids=[f"{f}-{s}" for f, s in RETRIED])
async def test_failures_before_the_first_byte_are_retried_transparently(
    fault: str, stream: bool
) -> None:
    async with faulty(fault) as (url, state):
        text, served = await _ask(url, stream)
        assert served.startswith("base:") and len(text.split()) >= 10
        assert [d["reason"] for d in state.decisions.recent] == ["below_crossover", "retry"]


async def test_an_error_the_backend_answers_is_relayed_not_retried() -> None:
    async with faulty("status:500") as (url, state):
        with pytest.raises(openai.InternalServerError) as raised:
            await _ask(url, stream=False)
        assert "injected" in raised.value.message
        assert [d["reason"] for d in state.decisions.recent] == ["below_crossover"]


ENDED = [  # (fault, stream, error): after the first byte, an error the client can read
    ("cut_mid:3", True, r"failed mid-stream"),
    ("cut_mid:3,mid_event=true", True, r"failed mid-stream"),
    ("stall_mid:3,seconds=5", True, r"failed mid-stream"),
    ("compress;cut_mid:3", True, r"failed mid-stream"),  # a stream is never compressed
]


@pytest.mark.parametrize(("fault", "stream", "error"), ENDED, ids=[f for f, *_ in ENDED])
async def test_failures_after_the_first_byte_end_with_an_error_event(
    fault: str, stream: bool, error: str
) -> None:
    async with faulty(fault) as (url, state):
        started = time.monotonic()
        with pytest.raises(openai.APIError, match=error):
            await _ask(url, stream)
        assert time.monotonic() - started < 5 * IDLE + 2  # never a hang past the idle limit
        assert [d["reason"] for d in state.decisions.recent] == ["below_crossover"]


async def test_a_stream_gone_silent_after_its_first_byte_is_the_backends_timeout() -> None:
    """After the first byte the router's watchdog, not aiohttp's per-chunk timer, hears the
    silence: within the idle limit and a tick, counted as the backend's ``timeout``."""
    async with faulty("stall_mid:3,seconds=30") as (url, state):
        started = time.monotonic()
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            await _ask(url, stream=True)
        assert IDLE <= time.monotonic() - started < 2 * IDLE + 1
        sample = state.metrics.exposed.get_sample_value
        spec = state.roster.backends[0].name
        assert sample("specroute_upstream_errors_total", {"backend": spec, "kind": "timeout"}) == 1
        requests = {"pool": "spec", "backend": spec, "status": "broken"}
        assert sample("specroute_requests_total", requests) == 1


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "non-streamed"])
async def test_a_silent_backend_times_out_with_504_and_no_second_run(stream: bool) -> None:
    async with faulty("stall_first:5") as (url, state):
        started = time.monotonic()
        with pytest.raises(openai.APIStatusError) as raised:
            await _ask(url, stream)
        assert raised.value.status_code == 504 and "not retried" in raised.value.message
        assert time.monotonic() - started < 5 * IDLE + 2
        assert [d["reason"] for d in state.decisions.recent] == ["below_crossover"]


@pytest.mark.parametrize("fault", ["slow:3", "compress", "stall_mid:3,seconds=0.2"])
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "non-streamed"])
async def test_a_slow_compressed_or_briefly_stalled_answer_comes_whole(
    fault: str, stream: bool
) -> None:
    async with faulty(fault) as (url, _):
        text, served = await _ask(url, stream)
        assert served.startswith("spec:") and len(text.split()) >= 10


async def test_traffic_leaves_a_refusing_pool_and_comes_back() -> None:
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(
            spec=[spec],
            base=[base],
            crossover=100,
            health_interval=0.1,
            eject_seconds=2,
            eject_max_seconds=2,
        ) as (url, state),
        aiohttp.ClientSession() as s,
    ):

        async def served_by() -> list[str]:
            return [(await _ask(url, stream=False))[1].split(":")[0] for _ in range(4)]

        assert await served_by() == ["spec"] * 4
        async with s.post(f"{spec}/emulator/faults", json={"faults": ["refuse"]}) as r:
            assert r.status == 200
        await asyncio.sleep(0.5)  # health checks fail: the breaker opens
        assert not state.roster.backends[0].healthy
        assert await served_by() == ["base"] * 4  # straight to the healthy pool
        assert {d["reason"] for d in list(state.decisions.recent)[-4:]} == {"failover"}
        async with s.delete(f"{spec}/emulator/faults") as r:
            assert r.status == 200
        await asyncio.sleep(2.5)  # the cool-down, then a half-open probe that succeeds
        assert await served_by() == ["spec"] * 4
        await settled(state)
        assert state.inflight() == 0


async def test_a_crash_mid_stream_ends_with_an_error_and_the_next_requests_go_elsewhere() -> None:
    async with (
        spawned("emulate", "--mode", "spec", *FAST, "--fault", "crash:3") as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(
            spec=[spec.url], base=[base], crossover=100, health_interval=0.1, idle_timeout=IDLE
        ) as (url, state),
    ):
        with pytest.raises(openai.APIError, match="failed mid-stream"):
            await _ask(url, stream=True)
        await spec.process.wait()
        for _ in range(3):  # dead: refused at connect, each retried on the plain pool at once
            text, served = await _ask(url, stream=True)
            assert served.startswith("base:") and len(text.split()) >= 10
        await settled(state)
        assert state.inflight() == 0
