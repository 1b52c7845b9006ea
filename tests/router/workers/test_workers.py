"""``specroute serve --workers N``: worker processes on one port that route as one router.

Against a real router process with two workers and a small backend in the test whose
streams stay open until the test lets them end: every worker sees the deployment's live
concurrency, decides as one router would, reports metrics that add up, leaves health checks
and polling to one of them, and drains on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import signal
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from specroute import prometheus
from specroute.loadgen.spawn import spawned
from tests.apps import serving
from tests.router.test_router_ops import profile

WORKERS, HELD, CROSSOVER = 2, 10, 6
INTERVAL = 0.2  # the router's health and poll interval here
ADMIN = "admin-key-for-the-test"


class Held:
    """An SGLang-shaped backend whose streams send one event and wait for ``release``; it
    counts the health checks and scrapes it gets."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.hits: Counter[str] = Counter()
        self.open = 0  # streams begun and not yet released
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._chat)
        for path in ("/health", "/metrics"):
            self.app.router.add_get(path, self._probe)

    async def _probe(self, request: web.Request) -> web.Response:
        self.hits[request.path] += 1
        return web.Response(text="" if request.path == "/metrics" else "ok")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b'data: {"choices": [{"delta": {"content": "a"}}]}\n\n')
        self.open += 1
        await self.release.wait()
        self.open -= 1
        await response.write(b'data: {"choices": [{"delta": {"content": "b"}}]}\n\n')
        await response.write(b"data: [DONE]\n\n")
        return response


@asynccontextmanager
async def deployment(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[str, Held, Any]]:
    monkeypatch.setenv("SPECROUTE_HEALTH_INTERVAL", str(INTERVAL))
    monkeypatch.setenv("SPECROUTE_POLL_INTERVAL", str(INTERVAL))
    spec, base = Held(), Held()
    base.release = spec.release  # one gate for every stream
    async with (
        serving(spec.app) as spec_url,
        serving(base.app) as base_url,
        spawned(
            "serve",
            "--spec",
            spec_url,
            "--base",
            base_url,
            "--crossover",
            str(CROSSOVER),
            "--workers",
            str(WORKERS),
            "--drain-grace",
            "0",
            "--drain-timeout",
            "10",
            "--admin-key",
            ADMIN,
        ) as router,
    ):
        await _every_worker(router.url)  # each is listening
        yield router.url, spec, router


async def _every_worker(url: str) -> dict[int, tuple[dict[str, Any], dict[str, float]]]:
    """Each worker's ``/router/status`` and ``/metrics`` (sums by name): both read on one new
    connection, which the kernel gives to one worker, until every worker has answered."""
    found: dict[int, tuple[dict[str, Any], dict[str, float]]] = {}
    for _ in range(200):
        connector = aiohttp.TCPConnector(limit=1)  # one connection: one worker
        async with aiohttp.ClientSession(connector=connector) as s:
            async with s.get(url + "/router/status") as r:
                status = await r.json()
            async with s.get(url + "/metrics") as r:
                metrics = prometheus.sums(await r.text(), _SUMMED)
        found.setdefault(status["worker"]["index"], (status, metrics))
        if len(found) == WORKERS:
            return found
    raise AssertionError(f"only workers {sorted(found)} answered")


_SUMMED = (
    "specroute_admitted_requests",
    "specroute_queue_depth",
    "specroute_live_concurrency",
    "specroute_inflight",
    "specroute_requests_total",
    "specroute_route_decisions_total",
    "specroute_crossover",
)


async def _open_stream(session: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    response = await session.post(url + "/v1/chat/completions", json=body)
    assert response.status == 200
    await response.content.readline()  # the first event: dispatched, in flight
    return response


async def _spread_streams(
    session: aiohttp.ClientSession, url: str
) -> tuple[list[aiohttp.ClientResponse], dict[int, tuple[dict[str, Any], dict[str, float]]]]:
    """``HELD`` streams in flight, then one more at a time until every worker has taken one
    (the kernel's hash of each connection can give ten in a row to one worker), with every
    worker's view once they are."""
    held = [await _open_stream(session, url) for _ in range(HELD)]
    while True:
        seen = await _every_worker(url)
        per_worker = [len(status["recent_decisions"]) for status, _ in seen.values()]
        if min(per_worker) > 0:
            return held, seen
        assert len(held) < 2 * HELD, f"the streams were not spread: {per_worker}"
        held.append(await _open_stream(session, url))


async def test_workers_see_the_total_and_decide_as_one_router(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with deployment(monkeypatch) as (url, spec, _):
        # each stream on a connection of its own, opened once the ones before it are in flight
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            held, seen = await _spread_streams(session, url)
            for status, metrics in seen.values():  # every worker's view is the deployment's
                assert status["live_concurrency"]["total"] == len(held)
                assert sum(b["inflight"] for b in status["backends"]) == len(held)
                assert metrics["specroute_live_concurrency"] == len(held)
                assert metrics["specroute_inflight"] == len(held)
            decided = [d for status, _ in seen.values() for d in status["recent_decisions"]]
            # the n-th stream saw n in flight, whichever worker took it: one count, shared
            assert sorted(d["live_concurrency"] for d in decided) == list(range(len(held)))
            for d in decided:  # and each was decided as one router with that load decides
                speculate = d["live_concurrency"] + 1 <= CROSSOVER
                assert d["pool"] == ("spec" if speculate else "base"), d
            spec.release.set()
            for response in held:
                assert b"[DONE]" in await response.read()
                response.release()
        # counts add up whichever worker answers the scrape; the gauges are back at 0
        for _, metrics in (await _every_worker(url)).values():
            assert metrics["specroute_requests_total"] == len(held)
            assert metrics["specroute_route_decisions_total"] == len(held)
            assert metrics["specroute_live_concurrency"] == 0


async def test_the_limit_of_requests_holds_across_the_workers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    limit = 3
    monkeypatch.setenv("SPECROUTE_MAX_CONCURRENT_REQUESTS", str(limit))
    async with deployment(monkeypatch) as (url, spec, _):
        connector = aiohttp.TCPConnector(limit=0, force_close=True)  # spread over the workers
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with aiohttp.ClientSession(connector=connector) as session:
            posts = [
                asyncio.create_task(session.post(url + "/v1/chat/completions", json=body))
                for _ in range(HELD)
            ]
            for _ in range(200):
                seen = await _every_worker(url)
                if all(m["specroute_queue_depth"] == HELD - limit for _, m in seen.values()):
                    break
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.2)  # a slot taken past the limit would show by now
            assert spec.open == limit  # at the backends, by their own count
            for _, metrics in seen.values():
                assert metrics["specroute_admitted_requests"] == limit
                assert metrics["specroute_queue_depth"] == HELD - limit
            spec.release.set()
            for response in await asyncio.gather(*posts):
                assert (await response.read()).endswith(b"data: [DONE]\n\n")
                response.release()
        for _, metrics in (await _every_worker(url)).values():
            assert metrics["specroute_requests_total"] == HELD
            assert metrics["specroute_admitted_requests"] == 0
            assert metrics["specroute_queue_depth"] == 0


async def test_one_worker_checks_health_and_polls_for_all(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with deployment(monkeypatch) as (_, spec, _):
        await asyncio.sleep(0.5)  # past start-up
        before = Counter(spec.hits)
        window = 3.0
        await asyncio.sleep(window)
        rounds = window / INTERVAL
        for path in ("/health", "/metrics"):
            made = spec.hits[path] - before[path]
            # one poller makes about `rounds`; each worker polling would make WORKERS times
            assert rounds * 0.5 <= made <= rounds * 1.4, (path, made)


async def test_sigterm_drains_every_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    async with deployment(monkeypatch) as (url, spec, router):
        connector = aiohttp.TCPConnector(limit=0, force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            held = [await _open_stream(session, url) for _ in range(HELD)]
            seen = await _every_worker(url)
            assert all(status["recent_decisions"] for status, _ in seen.values())  # both hold
            router.process.send_signal(signal.SIGTERM)
            await asyncio.sleep(1.0)
            assert router.process.returncode is None  # draining, streams still open
            spec.release.set()
            for response in held:  # every stream, on both workers, ends whole
                body = (await response.read()).decode()
                assert body.endswith("data: [DONE]\n\n"), body
                assert "error" not in body
        assert await asyncio.wait_for(router.process.wait(), 10) == 0
        assert router.said().count("stopped, 0 request(s) cut off") == WORKERS


async def test_a_profile_posted_to_one_worker_routes_every_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async with deployment(monkeypatch) as (url, _, _):
        for crossover in (3.0, 11.0):  # twice: a second post is followed too
            body = profile(crossover)
            headers = {"Authorization": f"Bearer {ADMIN}"}
            async with (
                aiohttp.ClientSession() as s,
                s.post(f"{url}/router/profile", json=body, headers=headers) as r,
            ):
                assert r.status == 200, await r.text()
                assert (await r.json())["policy"]["parameters"]["crossover"] == crossover
            await asyncio.sleep(0.5)  # the others follow within a tenth of a second
            for status, metrics in (await _every_worker(url)).values():
                assert status["policy"]["parameters"]["crossover"] == crossover
                assert status["profile"]["source"] == "POST /router/profile"
                assert metrics["specroute_crossover"] == crossover


async def test_servers_discovered_reach_every_worker(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The leader reads the backends file; every worker routes by what it read, and a
    stream at a server that left, through any worker, ends whole."""
    monkeypatch.setenv("SPECROUTE_WATCH_INTERVAL", str(INTERVAL))
    first, second, base = Held(), Held(), Held()
    second.release = base.release = first.release
    targets = tmp_path / "targets.json"

    def listing(*urls: tuple[str, str], group: str = "") -> None:
        labels = {"group": group} if group else {}
        groups = [
            {"targets": [u.removeprefix("http://")], "labels": {"pool": p} | labels}
            for p, u in urls
        ]
        staged = tmp_path / "staged.json"
        staged.write_text(json.dumps(groups))
        staged.replace(targets)

    async with (
        serving(first.app) as first_url,
        serving(second.app) as second_url,
        serving(base.app) as base_url,
    ):
        listing(("spec", first_url), ("base", base_url))
        async with spawned(
            "serve",
            "--backends-file",
            str(targets),
            "--crossover",
            "100",
            "--workers",
            str(WORKERS),
        ) as router:
            url = router.url
            connector = aiohttp.TCPConnector(limit=0, force_close=True)
            async with aiohttp.ClientSession(connector=connector) as session:
                leaving = [await _open_stream(session, url) for _ in range(4)]
                listing(("spec", second_url), ("base", base_url))
                await asyncio.sleep(4 * INTERVAL)
                for status, _ in (await _every_worker(url)).values():
                    names = {b["url"] for b in status["backends"]}
                    assert names == {second_url, base_url}, (status["worker"], names)
                joined = [await _open_stream(session, url) for _ in range(4)]
                served = {r.headers["x-specroute-backend"] for r in joined}
                assert served == {f"spec:{second_url.removeprefix('http://')}"}
                first.release.set()
                for response in leaving + joined:
                    body = (await response.read()).decode()
                    assert body.endswith("data: [DONE]\n\n") and "error" not in body
            for _, metrics in (await _every_worker(url)).values():
                assert metrics["specroute_inflight"] == 0
            listing(("spec", second_url), ("base", base_url), group="node7")  # same servers
            await asyncio.sleep(4 * INTERVAL)
            for status, _ in (await _every_worker(url)).values():
                assert {b["group"] for b in status["backends"]} == {"node7"}, status["worker"]
