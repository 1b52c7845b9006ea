"""Admission control: the router-wide limit of requests, its queue, per-key rate limits and
waiting for a backend at capacity, against stub backends and emulated servers on loopback
with the ``openai`` client as the caller."""

from __future__ import annotations

import asyncio
import multiprocessing
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import openai
import pytest

from specroute.bench.servers.stub_backend import Answers, Stub, listen
from specroute.cli import parser
from specroute.router.admission.quota import Quota
from specroute.router.serve import drain
from specroute.router.settings import RouterSettings
from specroute.serve_command import given_settings
from tests.emulator.test_emulator_api import metric
from tests.emulators import running_emulator
from tests.router.proxy.test_router import settled
from tests.routers import running_router

CHAT: dict[str, Any] = {"model": "stub", "messages": [{"role": "user", "content": "hi"}]}


@asynccontextmanager
async def stubs(gap: float, chunks: int = 4) -> AsyncIterator[tuple[Stub, Stub, str, str]]:
    """A speculative and a plain stub server whose answers take ``gap * (chunks - 1)`` s."""
    spec, base = Stub(Answers("stub", chunks, gap), gap), Stub(Answers("stub", chunks, gap), gap)
    servers = [await listen("127.0.0.1", 0, s) for s in (spec, base)]
    try:
        spec_url, base_url = (f"http://127.0.0.1:{s.sockets[0].getsockname()[1]}" for s in servers)
        yield spec, base, spec_url, base_url
    finally:
        for server in servers:
            server.close()


def caller(url: str, key: str = "unused") -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


async def most_at_once(
    sample: Callable[[], int], work: Awaitable[list[Any]]
) -> tuple[int, list[Any]]:
    """The largest ``sample()`` seen while ``work`` runs, and what it returned."""
    task = asyncio.ensure_future(work)
    most = 0
    while not task.done():
        most = max(most, sample())
        await asyncio.sleep(0.002)
    return most, await task


async def test_concurrency_never_exceeds_the_limit_and_every_slot_comes_back() -> None:
    async with (
        stubs(gap=0.03) as (spec, base, spec_url, base_url),
        running_router(
            spec=[spec_url], base=[base_url], policy="round-robin", max_concurrent_requests=3
        ) as (url, state),
    ):
        client = caller(url)
        work = asyncio.gather(*(client.chat.completions.create(**CHAT) for _ in range(12)))
        most, answers = await most_at_once(lambda: spec.running + base.running, work)
        assert most == 3  # the limit reached, never passed, by the servers' own count
        assert all(a.choices[0].message.content for a in answers)
        await settled(state)
        assert state.admission.quota.admitted() == 0 and state.admission.quota.queued() == 0
        assert await metric(url, "specroute_admitted_requests") == 0
        assert await metric(url, "specroute_queue_depth") == 0
        assert await metric(url, "specroute_requests_total") == 12
        assert await metric(url, "specroute_queue_wait_seconds_count") >= 9  # all but 3 waited
        assert await metric(url, "specroute_admission_refusals_total") == 0
        await client.close()


async def test_a_full_queue_answers_429_and_a_long_wait_503() -> None:
    async with (
        stubs(gap=0.1, chunks=6) as (_, _, spec_url, base_url),
        running_router(
            spec=[spec_url],
            base=[base_url],
            max_concurrent_requests=1,
            queue_size=1,
            queue_timeout=0.2,
            crossover=1,
        ) as (url, state),
    ):
        client = caller(url)
        held = asyncio.create_task(client.chat.completions.create(**CHAT))  # 0.5 s
        await _until(lambda: state.admission.quota.admitted() == 1)
        waiting = asyncio.create_task(client.chat.completions.create(**CHAT))
        await _until(lambda: state.admission.quota.queued() == 1)
        with pytest.raises(openai.RateLimitError) as full:
            await client.chat.completions.create(**CHAT)
        started = time.monotonic()
        with pytest.raises(openai.InternalServerError) as late:
            await waiting
        assert time.monotonic() - started < 0.5  # refused at its timeout, not at the end
        for refused, status, kind in (
            (full, 429, "rate_limit_error"),
            (late, 503, "service_unavailable"),
        ):
            response = refused.value.response
            assert response.status_code == status
            assert int(response.headers["retry-after"]) >= 1
            error = response.json()["error"]
            assert error["type"] == kind and error["code"] == status and error["message"]
        assert (await held).choices[0].message.content  # the one admitted is served whole
        await settled(state)
        assert state.admission.quota.admitted() == 0 and state.admission.quota.queued() == 0
        async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
            text = await r.text()
        assert 'specroute_admission_refusals_total{reason="queue_full"} 1.0' in text
        assert 'specroute_admission_refusals_total{reason="queue_timeout"} 1.0' in text
        assert await metric(url, "specroute_requests_total") == 1
        await client.close()


async def test_a_client_that_leaves_the_queue_takes_no_slot_with_it() -> None:
    async with (
        stubs(gap=0.05) as (_, _, spec_url, base_url),
        running_router(
            spec=[spec_url], base=[base_url], max_concurrent_requests=1, crossover=1
        ) as (url, state),
    ):
        client = caller(url)
        held = asyncio.create_task(client.chat.completions.create(**CHAT))
        await _until(lambda: state.admission.quota.admitted() == 1)
        async with aiohttp.ClientSession() as s:
            gone = asyncio.create_task(s.post(f"{url}/v1/chat/completions", json=CHAT))
            await _until(lambda: state.admission.quota.queued() == 1)
            gone.cancel()  # the connection closes while the request waits
            await _until(lambda: state.admission.quota.queued() == 0)
        assert (await held).choices
        assert (await client.chat.completions.create(**CHAT)).choices  # its slot is free
        await settled(state)
        assert state.admission.quota.admitted() == 0
        assert await metric(url, "specroute_requests_total") == 2
        await client.close()


async def test_a_queued_request_is_routed_at_the_load_it_joins_when_admitted() -> None:
    """With a crossover of 1, a request that came while another ran (load 1: plain) but was
    admitted once it had ended (load 0) speculates."""
    async with (
        stubs(gap=0.05) as (_, _, spec_url, base_url),
        running_router(
            spec=[spec_url], base=[base_url], max_concurrent_requests=1, crossover=1
        ) as (url, state),
    ):
        client = caller(url)
        chat = client.chat.completions.with_raw_response.create
        first = asyncio.ensure_future(chat(**CHAT))
        await _until(lambda: state.admission.quota.admitted() == 1)
        assert state.view().load() == 1  # what a decision on arrival would have seen
        second = asyncio.ensure_future(chat(**CHAT))
        await _until(lambda: state.admission.quota.queued() == 1)
        answers = [await first, await second]
        assert [a.headers["x-specroute-backend"].split(":")[0] for a in answers] == ["spec"] * 2
        assert [d["live_concurrency"] for d in state.decisions.recent] == [0, 0]
        await client.close()


async def test_the_rate_limit_is_each_keys_own() -> None:
    keys = ["sk-first-0123456789", "sk-second-0123456789"]
    async with (
        stubs(gap=0.0, chunks=1) as (_, _, spec_url, base_url),
        running_router(
            spec=[spec_url],
            base=[base_url],
            api_keys=keys,
            rate_limit=0.5,
            rate_limit_burst=2,
            crossover=1,
        ) as (url, state),
    ):
        first, second = caller(url, keys[0]), caller(url, keys[1])
        for _ in range(2):
            await first.chat.completions.create(**CHAT)  # the burst
        with pytest.raises(openai.RateLimitError) as limited:
            await first.chat.completions.create(**CHAT)
        response = limited.value.response
        assert response.json()["error"]["type"] == "rate_limit_error"
        assert 1 <= int(response.headers["retry-after"]) <= 2  # a token every 2 s
        assert (await second.chat.completions.create(**CHAT)).choices  # its own bucket
        async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
            text = await r.text()
        assert 'specroute_rate_limited_total{key="key0"} 1.0' in text
        assert 'specroute_rate_limited_total{key="key1"} 0.0' in text
        assert 'specroute_admission_refusals_total{reason="rate_limited"} 1.0' in text
        assert not any(key in text for key in keys)
        await settled(state)
        assert state.admission.quota.admitted() == 0
        await first.close()
        await second.close()


async def test_requests_wait_for_a_backend_at_capacity_instead_of_piling_on() -> None:
    flags = ("--time-scale", "0.05", "--max-running-requests", "2")
    async with (
        running_emulator("--mode", "spec", *flags) as spec,
        running_emulator("--mode", "base", *flags) as base,
        running_router(
            spec=[spec],
            base=[base],
            policy="always-spec",
            queue_at_capacity=True,
            poll_interval=0.05,
        ) as (url, state),
    ):
        await _until(lambda: state.view().backends[0].max_running_requests == 2)
        client = caller(url)
        request = {**CHAT, "max_tokens": 24, "extra_body": {"ignore_eos": True}}
        work = asyncio.gather(*(client.chat.completions.create(**request) for _ in range(6)))
        most, answers = await most_at_once(lambda: state.roster.backends[0].inflight, work)
        assert most == 2 and len(answers) == 6
        assert {d["pool"] for d in state.decisions.recent} == {"spec"}
        await settled(state)
        assert state.admission.quota.admitted() == 0 and state.admission.quota.queued() == 0
        await client.close()


def _take(quota: Quota, worker: int, n: int, done: Any) -> None:
    quota.become(worker)
    spent = quota.spend(0, rate=0.001, burst=1)  # the key's one token, taken in this worker
    done.put([quota.take() for _ in range(n)] + [spent == 0])
    # exits holding its slots, as a worker that dies does


def test_the_slots_are_the_routers_across_worker_processes() -> None:
    quota = Quota(2, limit=3, buckets=2)
    context = multiprocessing.get_context("fork")
    done = context.Queue()
    worker = context.Process(target=_take, args=(quota, 1, 2, done))
    worker.start()
    assert done.get(timeout=10) == [True, True, True]
    assert quota.spend(0, rate=0.001, burst=1) > 0  # the bucket is the router's
    worker.join(10)
    assert quota.admitted() == 2
    assert [quota.take(), quota.take()] == [True, False]  # one left of three
    quota.forget(1)  # the supervisor, for the worker that died
    assert quota.admitted() == 1
    assert [quota.take(), quota.take(), quota.take()] == [True, True, False]
    now = time.monotonic()
    assert quota.spend(1, rate=1.0, burst=1, now=now) == 0
    assert quota.spend(1, rate=1.0, burst=1, now=now + 0.5) == pytest.approx(0.5)
    assert quota.spend(1, rate=1.0, burst=1, now=now + 1.0) == 0


async def _until(condition: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        await asyncio.sleep(0.005)


def test_the_admission_flags_reach_the_settings() -> None:
    backends = ["serve", "--spec", "http://127.0.0.1:1", "--base", "http://127.0.0.1:2"]
    flags = [
        *("--max-concurrent-requests", "8", "--queue-size", "4", "--queue-timeout", "2.5"),
        *("--queue-at-capacity", "--rate-limit", "3", "--rate-limit-burst", "6"),
    ]
    given = RouterSettings(**given_settings(parser().parse_args([*backends, *flags])))
    default = RouterSettings(**given_settings(parser().parse_args(backends)))
    names = [
        *("max_concurrent_requests", "queue_size", "queue_timeout", "queue_at_capacity"),
        *("rate_limit", "rate_limit_burst"),
    ]
    assert [getattr(given.admission, n) for n in names] == [8, 4, 2.5, True, 3.0, 6]
    assert [getattr(default.admission, n) for n in names] == [None, 100, 60.0, False, None, None]


async def test_the_requests_waiting_are_refused_when_the_router_drains() -> None:
    async with (
        stubs(gap=0.05) as (_, _, spec_url, base_url),
        running_router(
            spec=[spec_url], base=[base_url], max_concurrent_requests=1, crossover=1
        ) as (url, state),
    ):
        client = caller(url)
        held = asyncio.create_task(client.chat.completions.create(**CHAT))
        await _until(lambda: state.admission.quota.admitted() == 1)
        waiting = asyncio.create_task(client.chat.completions.create(**CHAT))
        await _until(lambda: state.admission.quota.queued() == 1)
        draining = asyncio.create_task(drain(state, 0.0, 5.0, asyncio.Event()))
        with pytest.raises(openai.InternalServerError) as refused:
            await waiting
        assert refused.value.response.json()["error"]["message"] == "The router is shutting down."
        assert (await held).choices  # the one in flight finishes
        await draining
        assert state.admission.quota.admitted() == 0 and state.admission.quota.queued() == 0
        assert await metric(url, "specroute_admission_refusals_total") == 1
        await client.close()
