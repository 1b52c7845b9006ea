"""The router's poll of each backend's metrics, as SGLang serves them: gzipped for a client
that accepts gzip, with a live accept-length gauge. An answer that yields nothing is
counted and logged, never taken silently; and the router's log lines carry their time."""

from __future__ import annotations

import asyncio
import gzip
import logging
import re
from collections.abc import AsyncIterator

import aiohttp
import openai
import pytest
from aiohttp import web
from openai.types.chat import ChatCompletionMessageParam

from specroute import prometheus
from specroute.loadgen.spawn import spawned
from specroute.server_metrics import parse, window_accept_length
from tests.apps import serving
from tests.emulators import running_emulator
from tests.routers import running_router

FAST = ("--time-scale", "0.05")
CHAT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write a function that adds two numbers."}
]


async def _status(url: str) -> dict[str, dict[str, object]]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/router/status") as r:
        return {b["pool"]: b for b in (await r.json())["backends"]}


async def _errors(url: str, task: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    found = prometheus.values(
        text, {"specroute_background_errors_total"}, keep=lambda labels: labels.get("task") == task
    )
    return sum(found.get("specroute_background_errors_total", []))


async def test_the_emulator_gzips_its_metrics_for_a_client_that_accepts_it() -> None:
    async with (
        running_emulator("--mode", "spec", *FAST) as url,
        aiohttp.ClientSession(auto_decompress=False) as s,
    ):
        async with s.get(f"{url}/metrics", headers={"Accept-Encoding": "gzip"}) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            text = gzip.decompress(await r.read()).decode()
        async with s.get(f"{url}/metrics", headers={"Accept-Encoding": "identity"}) as r:
            assert "Content-Encoding" not in r.headers
            plain = await r.text()
    assert "sglang:num_running_reqs" in text and "sglang:num_running_reqs" in plain


async def test_the_router_reads_the_accept_length_the_server_shows() -> None:
    """Through gzip, the router's live accept length is the speculative server's own: its
    gauge where that moved last, else its counters over the request that finished last."""
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], policy="always-spec", poll_interval=0.1) as (
            url,
            _,
        ),
    ):
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        for _ in range(3):
            before = parse(await _metrics(spec))
            await client.chat.completions.create(
                model="m", messages=CHAT, max_tokens=64, extra_body={"ignore_eos": True}
            )
        await asyncio.sleep(0.5)  # polls after the last decode step: the gauge stands still
        after = parse(await _metrics(spec))
        shown = (await _status(url))["spec"]["accept_length"]
        assert await _errors(url, "poll") == 0
    assert shown in (after.accept_length_gauge, window_accept_length(before, after))
    assert isinstance(shown, float) and shown > 1.0


async def _metrics(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        return await r.text()


def _garbled(kind: str) -> web.Application:
    """A server that is up and answers its metrics in a way that yields nothing."""

    async def metrics(request: web.Request) -> web.Response:
        if kind == "not metrics":
            return web.Response(text="<html>maintenance</html>")
        return web.Response(body=b"\x1f\x8b not really", headers={"Content-Encoding": "gzip"})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


@pytest.fixture(params=["not metrics", "bad gzip"])
async def garbled(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    async with serving(_garbled(request.param)) as url:
        yield url


async def test_metrics_that_yield_nothing_are_counted_and_logged_once(
    garbled: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="specroute.router")
    async with (
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[garbled], base=[base], policy="always-base", poll_interval=0.05) as (
            url,
            _,
        ),
    ):
        await asyncio.sleep(0.5)
        counted = await _errors(url, "poll")
        status = await _status(url)
    assert counted >= 3  # every poll
    said = [r.getMessage() for r in caplog.records if "Cannot read /metrics" in r.getMessage()]
    assert len(said) == 1 and "spec:127.0.0.1" in said[0]
    assert status["spec"]["running"] is None  # no reading believed


async def test_the_routers_log_lines_start_with_their_time() -> None:
    stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z WARNING specroute\.router: ")
    async with serving(_garbled("not metrics")) as spec, running_emulator("--mode", "base") as base:
        args = (
            "serve",
            "--spec",
            spec,
            "--base",
            base,
            "--policy",
            "always-base",
            "--poll-interval",
            "0.1",
        )
        async with spawned(*args, ready="/ready") as router:
            for _ in range(50):
                if "Cannot read" in router.said():
                    break
                await asyncio.sleep(0.1)
            lines = [line for line in router.said().splitlines() if "Cannot read" in line]
    assert lines and stamp.match(lines[0]), router.said()
