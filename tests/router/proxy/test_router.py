"""The router between the official openai client and two emulators, over loopback."""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import openai
import pytest
from aiohttp import web

from specroute.router.backends.health import Breaker, Ejection
from specroute.router.state import RouterState
from tests.apps import serving
from tests.emulator.test_emulator_api import CHAT, client, metric
from tests.emulators import running_emulator
from tests.routers import running_router

LONG_STREAM = {
    "messages": [{"role": "user", "content": "hi"}],
    "max_tokens": 400,
    "stream": True,
    "ignore_eos": True,
}


async def settled(state: RouterState, seconds: float = 4.0) -> None:
    """Until the router has counted every request down (cancellations land a step later)."""
    for _ in range(int(seconds / 0.02)):
        if state.inflight() == 0:
            return
        await asyncio.sleep(0.02)


async def test_responses_identical_to_the_backend(backends: tuple[str, str]) -> None:
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=8) as (url, _):
        routed = await client(url).chat.completions.create(
            model="m", messages=CHAT, max_tokens=16, extra_body={"rid": "r1"}
        )
        direct = await client(spec).chat.completions.create(
            model="m", messages=CHAT, max_tokens=16, extra_body={"rid": "r2"}
        )
        assert routed.choices == direct.choices
        assert routed.usage == direct.usage
        raw = await client(url).chat.completions.with_raw_response.create(
            model="m", messages=CHAT, max_tokens=4
        )
        assert raw.headers["x-specroute-backend"].startswith("spec:")
        stream = await client(url).chat.completions.create(
            model="m", messages=CHAT, max_tokens=16, stream=True
        )
        assert (
            "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            == direct.choices[0].message.content
        )


async def first_chunk_seconds(url: str) -> float:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
    async with aiohttp.ClientSession() as s:
        started = time.perf_counter()
        async with s.post(f"{url}/v1/chat/completions", json=body) as r:
            await r.content.readline()
            return time.perf_counter() - started


async def test_first_chunk_is_not_held_back() -> None:
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.01") as spec,
        running_emulator("--mode", "base", "--time-scale", "0.01") as base,
        running_router(spec=[spec], base=[base], crossover=8) as (url, _),
    ):
        direct = sorted([await first_chunk_seconds(spec) for _ in range(10)])[5]
        routed = sorted([await first_chunk_seconds(url) for _ in range(10)])[5]
    assert routed - direct < 0.015, f"direct {direct * 1000:.1f} ms, routed {routed * 1000:.1f} ms"


async def test_routing_switches_at_the_crossover(backends: tuple[str, str]) -> None:
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=2) as (url, state):
        async with aiohttp.ClientSession() as s:
            responses = []
            for _ in range(4):
                r = await s.post(f"{url}/v1/chat/completions", json=LONG_STREAM)
                responses.append(r)
            pools = [r.headers["x-specroute-backend"].split(":")[0] for r in responses]
            for r in responses:
                r.close()
        assert pools == ["spec", "spec", "base", "base"]
        await settled(state, 2.0)
        assert [b.inflight for b in state.roster.backends] == [0, 0]
        assert await metric(url, "specroute_route_decisions_total") == 4
        assert await metric(url, "specroute_crossover") == 2


async def test_partitioned_spills_the_rest(backends: tuple[str, str]) -> None:
    spec, base = backends
    async with (
        running_router(spec=[spec], base=[base], crossover=1, topology="partitioned") as (url, _),
        aiohttp.ClientSession() as s,
    ):
        first = await s.post(f"{url}/v1/chat/completions", json=LONG_STREAM)
        second = await s.post(f"{url}/v1/chat/completions", json=LONG_STREAM)
        first.close()
        await asyncio.sleep(0.05)
        third = await s.post(f"{url}/v1/chat/completions", json=LONG_STREAM)
        pools = [r.headers["x-specroute-backend"].split(":")[0] for r in (first, second, third)]
        second.close()
        third.close()
    assert pools == ["spec", "base", "spec"]


async def test_inflight_returns_to_zero_after_cancellations(backends: tuple[str, str]) -> None:
    spec, base = backends
    rng = random.Random(3)
    async with running_router(spec=[spec], base=[base], crossover=16) as (url, state):
        c = client(url)

        async def one(i: int) -> None:
            stream = await c.chat.completions.create(
                model="m", messages=CHAT, max_tokens=rng.randint(2, 12), stream=True
            )
            async for _ in stream:
                pass

        pending = []
        for i in range(1000):
            task = asyncio.create_task(one(i))
            pending.append(task)
            if rng.random() < 1 / 3:
                asyncio.get_running_loop().call_later(rng.random() * 0.02, task.cancel)
            if len(pending) >= 32:
                await asyncio.gather(*pending, return_exceptions=True)
                pending.clear()
        await asyncio.gather(*pending, return_exceptions=True)
        await settled(state)
        assert [b.inflight for b in state.roster.backends] == [0, 0]
        assert await metric(url, "specroute_inflight") == 0
        assert await metric(url, "specroute_requests_total") > 500


@pytest.mark.parametrize(
    ("data", "content_type", "path", "status"),
    [
        (b"{nope", "application/json", "/v1/chat/completions", 400),
        (b'{"messages": []}', "text/plain", "/v1/chat/completions", 400),
        (b"[1, 2]", "application/json", "/v1/completions", 400),
        (b'{"text": "' + b"x" * 2048 + b'"}', "application/json", "/generate", 413),
        (b"{}", "application/json", "/v1/nothing", 404),
    ],
)
async def test_bad_input_never_reaches_a_backend(
    backends: tuple[str, str], data: bytes, content_type: str, path: str, status: int
) -> None:
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=4, max_body_bytes=1024) as (
        url,
        _,
    ):
        async with (
            aiohttp.ClientSession() as s,
            s.post(url + path, data=data, headers={"Content-Type": content_type}) as r,
        ):
            assert r.status == status
            error = (await r.json())["error"]
        assert error["message"] and error["code"] == status
        for backend in (spec, base):
            assert await metric(backend, "sglang:num_requests_total") == 0


async def test_failover_when_a_backend_is_down(backends: tuple[str, str]) -> None:
    _, base = backends
    dead = "http://127.0.0.1:9"  # discard port: nothing listens
    async with running_router(spec=[dead], base=[base], crossover=8) as (url, state):
        assert not state.roster.backends[0].healthy  # the first health check ran at start
        raw = await client(url).chat.completions.with_raw_response.create(
            model="m", messages=CHAT, max_tokens=3
        )
        assert raw.headers["x-specroute-backend"].startswith("base:")
        assert state.decisions.recent[-1]["reason"] == "failover"
        # as if no check had run: retried on base
        state.roster.backends[0].breaker = Breaker(Ejection())
        raw = await client(url).chat.completions.with_raw_response.create(
            model="m", messages=CHAT, max_tokens=3
        )
        assert raw.headers["x-specroute-backend"].startswith("base:")
        assert await metric(url, "specroute_upstream_errors_total") >= 1
        async with aiohttp.ClientSession() as s, s.get(f"{url}/router/status") as r:
            status = await r.json()
        assert status["policy"]["name"] == "crossover"
        assert [b["pool"] for b in status["backends"]] == ["spec", "base"]


async def test_models_and_readiness(backends: tuple[str, str]) -> None:
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=4) as (url, _):
        models = await client(url).models.list()
        assert [m.id for m in models.data] == ["moonshotai/Kimi-K2.5"]
        async with aiohttp.ClientSession() as s:
            for path in ("/health", "/ready", "/health_generate", "/metrics"):
                async with s.get(url + path) as r:
                    assert r.status == 200
    async with running_router(
        spec=["http://127.0.0.1:9"], base=["http://127.0.0.1:9"], crossover=4
    ) as (url, _):
        async with aiohttp.ClientSession() as s:
            for path in ("/ready", "/health_generate"):  # SGLang's probe: no server can
                async with s.get(url + path) as r:
                    assert r.status == 503
        with pytest.raises(openai.APIStatusError) as refused:
            await client(url).chat.completions.create(model="m", messages=CHAT, max_tokens=3)
        assert refused.value.status_code == 503


class EngineShaped:
    """A backend whose ``/metrics`` names say which engine it is; its streams send one event
    and wait; it keeps the ``/abort_request`` bodies it gets."""

    def __init__(self, engine: str) -> None:
        self.engine = engine
        self.aborted: list[object] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_post("/abort_request", self._abort)
        self.app.router.add_get("/health", self._probe)
        self.app.router.add_get("/metrics", self._probe)

    async def _probe(self, request: web.Request) -> web.Response:
        running = "num_running_reqs" if self.engine == "sglang" else "num_requests_running"
        return web.Response(text=f"{self.engine}:{running} 0\n")

    async def _abort(self, request: web.Request) -> web.Response:
        self.aborted.append(await request.json())
        return web.json_response({})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n')
        await asyncio.sleep(30)
        return response


@pytest.mark.parametrize(("engine", "by_rid"), [("sglang", True), ("vllm", False)])
async def test_a_client_that_leaves_is_aborted_by_rid_on_sglang_only(
    engine: str, by_rid: bool
) -> None:
    """Closing the connection frees the request on either engine; SGLang is also told by
    ``rid`` at ``/abort_request``, which vLLM does not serve."""
    backend = EngineShaped(engine)
    async with (
        serving(backend.app) as url,
        running_router(spec=[url], base=[url], crossover=8, poll_interval=0.05) as (router, _),
        aiohttp.ClientSession() as s,
    ):
        await asyncio.sleep(0.2)  # a reading: the engine is known
        body = {**LONG_STREAM, "rid": "leaving-1"}
        async with s.post(f"{router}/v1/chat/completions", json=body) as r:
            await r.content.readline()
        for _ in range(50):
            if backend.aborted:
                break
            await asyncio.sleep(0.02)
    assert backend.aborted == ([{"rid": "leaving-1"}] if by_rid else [])
