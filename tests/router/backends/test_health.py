"""A backend's health: the breaker's rules on a fake clock, the background loops that must
not die, and ejection and readmission through a real router on loopback."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import resource
import signal
from collections import deque
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pydantic
import pytest
from aiohttp import web

from specroute.loadgen.spawn import spawned
from specroute.router.app import build_state
from specroute.router.backends.backend import Backend
from specroute.router.backends.health import Breaker, BreakerState, Ejection, verdict
from specroute.router.backends.polls import Polling, every
from specroute.router.protocol.outcome import Outcome
from specroute.router.settings import RouterSettings
from tests.apps import listening, serving
from tests.emulator.test_emulator_api import CHAT, client
from tests.emulators import FAST, running_emulator
from tests.router.proxy.test_router import LONG_STREAM, settled
from tests.router.test_router_ops import samples
from tests.routers import running_router

CLOSED, HALF_OPEN, OPEN = BreakerState.CLOSED, BreakerState.HALF_OPEN, BreakerState.OPEN


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def breaker(clock: Clock, **rules: Any) -> Breaker:
    given = {"after_failures": 3, "seconds": 5.0, "max_seconds": 30.0} | rules
    return Breaker(Ejection(**given), clock)


def play(b: Breaker, clock: Clock, steps: str) -> list[BreakerState | None]:
    """``ok`` and ``fail`` are results, ``+S`` moves the clock S seconds; what each moved."""
    moved = []
    for step in steps.split():
        if step.startswith("+"):
            clock.now += float(step)
        else:
            moved.append(b.record(step == "ok"))
    return moved


# (case, rules, steps, state after, ejections, cool-down of the last ejection)
BREAKER_CASES: list[tuple[str, dict[str, Any], str, BreakerState, int, float]] = [
    ("never seen working: its first failure ejects", {}, "fail", OPEN, 1, 5),
    ("two failures in a row do not eject", {}, "ok fail fail", CLOSED, 0, 0),
    ("a success starts the count again", {}, "ok fail fail ok fail fail", CLOSED, 0, 0),
    ("the third in a row ejects", {}, "ok fail fail fail", OPEN, 1, 5),
    ("one failure ejects when one is the rule", {"after_failures": 1}, "ok fail", OPEN, 1, 5),
    ("nothing counts while open", {}, "ok fail fail fail ok ok fail +4.9", OPEN, 1, 5),
    ("half-open once the cool-down ends", {}, "ok fail fail fail +5", HALF_OPEN, 1, 5),
    ("a trial that works readmits", {}, "ok fail fail fail +5 ok", CLOSED, 1, 5),
    ("a failed trial ejects again, for longer", {}, "ok fail fail fail +5 fail", OPEN, 2, 10),
    ("the longer cool-down is waited out", {}, "ok fail fail fail +5 fail +9.9", OPEN, 2, 10),
    ("then half-open again", {}, "ok fail fail fail +5 fail +10", HALF_OPEN, 2, 10),
    (
        "cool-downs stop growing at the maximum",
        {"max_seconds": 12},
        "fail +5 fail +10 fail +12 fail",
        OPEN,
        4,
        12,
    ),
    (
        "readmitted and failing at once: longer",
        {},
        "ok fail fail fail +5 ok fail fail fail",
        OPEN,
        2,
        10,
    ),
    (
        "readmitted and well for a cool-down: forgiven",
        {},
        "ok fail fail fail +5 ok +5 fail fail fail",
        OPEN,
        2,
        5,
    ),
    (
        "two successes to readmit: one is not enough",
        {"readmit_after_successes": 2},
        "ok fail fail fail +5 ok",
        HALF_OPEN,
        1,
        5,
    ),
    (
        "two successes to readmit: two are",
        {"readmit_after_successes": 2},
        "ok fail fail fail +5 ok ok",
        CLOSED,
        1,
        5,
    ),
    (
        "two successes to readmit: a failure between ejects",
        {"readmit_after_successes": 2},
        "ok fail fail fail +5 ok fail",
        OPEN,
        2,
        10,
    ),
]


@pytest.mark.parametrize(
    ("rules", "steps", "state", "ejections", "cool_down"),
    [case[1:] for case in BREAKER_CASES],
    ids=[case[0] for case in BREAKER_CASES],
)
def test_breaker(
    rules: dict[str, Any], steps: str, state: BreakerState, ejections: int, cool_down: float
) -> None:
    clock = Clock()
    b = breaker(clock, **rules)
    moved = play(b, clock, steps)
    assert b.state is state
    assert (b.ejections, b.cool_down) == (ejections, cool_down)
    assert moved.count(OPEN) == ejections  # each ejection said once, as it happened


def test_what_moved_is_said_once() -> None:
    clock = Clock()
    b = breaker(clock)
    assert play(b, clock, "ok fail fail fail fail +5 ok ok") == [
        None,
        None,
        None,
        OPEN,
        None,
        CLOSED,
        None,
    ]


@pytest.mark.parametrize(
    ("steps", "busy", "admits"),
    [
        ("", False, True),
        ("", True, True),  # closed: as many as the policy sends
        ("fail", False, False),
        ("fail", True, False),
        ("fail +5", False, True),  # half-open: one trial
        ("fail +5", True, False),  # its trial is in flight
    ],
)
def test_who_gets_traffic(steps: str, busy: bool, admits: bool) -> None:
    clock = Clock()
    b = breaker(clock)
    play(b, clock, steps)
    assert b.admits(busy=busy) is admits


def test_the_status_shows_the_breaker() -> None:
    clock = Clock()
    b = breaker(clock)
    play(b, clock, "ok fail fail fail +2")
    assert b.describe() == {
        "state": "open",
        "failures_in_a_row": 0,
        "ejections": 1,
        "half_open_in": 3.0,
    }


@pytest.mark.parametrize(
    ("outcome", "counts"),
    [
        (Outcome.ANSWERED, True),
        (Outcome.CONNECT, False),
        (Outcome.MIDSTREAM, False),
        (Outcome.TIMEOUT, False),
        (Outcome.BROKEN, False),
        (Outcome.UNAVAILABLE, None),  # busy is not ill
        (Outcome.CANCELLED, None),  # the client's
        (Outcome.CUT_OFF, None),  # the router's drain
        (Outcome.OUT_OF_FDS, None),  # the router's own
        (Outcome.INTERNAL, None),
    ],
)
def test_what_a_request_says_of_its_backend(outcome: Outcome, counts: bool | None) -> None:
    assert verdict(outcome) is counts


def test_every_outcome_has_a_verdict() -> None:
    for outcome in Outcome:
        verdict(outcome)


TWO_BACKENDS: dict[str, Any] = {
    "spec": ["http://127.0.0.1:9"],
    "base": ["http://127.0.0.1:9"],
    "crossover": 4,
}


def test_cool_downs_that_cannot_grow_are_refused() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"eject_max_seconds \(2\).*eject_sec"):
        RouterSettings(**TWO_BACKENDS, eject_seconds=3, eject_max_seconds=2)


# The loops: an exception nobody expected is logged, counted, and the loop goes on


async def test_a_job_that_raises_is_logged_counted_and_run_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = pydantic.SecretStr("backend-secret")
    state = build_state(RouterSettings(**TWO_BACKENDS, backend_api_key=key))
    ran: list[str] = []

    async def job(polling: Polling, backend: Backend) -> None:
        ran.append(backend.name)
        if len(ran) == 1:
            raise RuntimeError("a bug in the job")

    loop = asyncio.create_task(every(0.01, "poll", state.polling, job))
    for _ in range(200):
        if len(ran) >= 10:
            break
        await asyncio.sleep(0.01)
    loop.cancel()
    with pytest.raises(asyncio.CancelledError):
        await loop
    assert set(ran[:2]) == {"spec:127.0.0.1:9", "base:127.0.0.1:9"}  # the other ran too
    assert len(ran) >= 10  # and the rounds went on
    errors = state.metrics.exposed.get_sample_value
    assert errors("specroute_background_errors_total", {"task": "poll"}) == 1
    [record] = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.name == "specroute.router" and record.exc_info is not None
    assert "poll" in record.getMessage() and "spec:127.0.0.1:9" in record.getMessage()
    assert "a bug in the job" in caplog.text and "Traceback" in caplog.text
    assert "backend-secret" not in caplog.text


# Through a router


class RawBackend:
    """A backend on a raw socket, told how to answer: each health check by the next of
    ``health`` (an HTTP status or ``garbage``; 200 once none is left), each POST by
    ``answer`` (``ok`` or ``hang up``: the request read, then the connection closed without
    a byte; aiohttp would send a GET that met a hang-up once more). Closes every connection
    after its answer."""

    def __init__(self) -> None:
        self.health: deque[str] = deque()
        self.answer = "ok"
        self.probes = self.posts = 0

    def serving(self) -> AbstractAsyncContextManager[str]:
        return listening(self._serve)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        length = head.partition(b"content-length:")[2].split(b"\r\n")[0]
        await reader.readexactly(int(length or 0))
        if head.startswith(b"get /health"):
            self.probes += 1
            how = self.health.popleft() if self.health else "200"
        elif head.startswith(b"post "):
            self.posts += 1
            how = self.answer
        else:
            how = "404"
        if how == "ok":
            writer.write(_reply(200, _CHAT_ANSWER, b"application/json"))
        elif how == "garbage":
            writer.write(b"garbage\r\n\r\n")
        elif how != "hang up":
            writer.write(_reply(int(how), b"", b"text/plain"))
        await writer.drain()
        writer.close()


_CHAT_ANSWER = json.dumps(
    {
        "id": "c1",
        "object": "chat.completion",
        "created": 1,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "fine"},
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
).encode()


async def _spare_descriptors(pid: int, limit: int) -> int:
    """The most descriptors the process had to spare over a fifth of a second (a health
    check takes a spare one for a moment)."""
    most = 0
    for _ in range(20):
        most = max(most, limit - len(os.listdir(f"/proc/{pid}/fd")))
        await asyncio.sleep(0.01)
    return most


def _reply(status: int, body: bytes, content_type: bytes) -> bytes:
    return (
        b"HTTP/1.1 %d X\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
    ) % (status, content_type, len(body), body)


async def served_by(url: str) -> str:
    raw = await client(url).chat.completions.with_raw_response.create(
        model="m", messages=CHAT, max_tokens=2
    )
    return raw.headers["x-specroute-backend"].split(":")[0]


async def scrape(url: str) -> str:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        assert r.status == 200
        return await r.text()


async def status_of(url: str, pool: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/router/status") as r:
        assert r.status == 200
        backends: list[dict[str, Any]] = (await r.json())["backends"]
    return next(b for b in backends if b["pool"] == pool)


def shown(text: str, backend: str) -> tuple[float, float, float]:
    """What the metrics say of a backend: breaker state, healthy, ejections."""
    label = (("backend", backend),)
    return (
        samples(text, "specroute_backend_breaker_state")[label],
        samples(text, "specroute_backend_healthy")[label],
        samples(text, "specroute_backend_ejections_total")[label],
    )


async def test_failing_requests_eject_a_backend_whose_health_checks_pass() -> None:
    """Its ``/health`` answers 200 all along, but its requests fail: ejected after three in
    a row, traffic goes to the other pool, a trial after the cool-down that fails ejects it
    again for twice as long, and one that works readmits it. Health checks (one a minute)
    play no part."""
    flaky = RawBackend()
    async with (
        flaky.serving() as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(
            spec=[spec],
            base=[base],
            crossover=8,
            health_interval=60,
            eject_after_failures=3,
            eject_seconds=0.4,
            eject_max_seconds=2,
        ) as (url, state),
    ):
        backend = state.roster.backends[0]
        assert (await status_of(url, "spec"))["breaker"]["state"] == "closed"
        flaky.answer = "hang up"
        for _ in range(3):  # each fails there, is retried on base and answered
            assert await served_by(url) == "base"
        assert flaky.posts == 3
        assert shown(await scrape(url), backend.name) == (2, 0, 1)
        assert (await status_of(url, "spec"))["breaker"]["state"] == "open"

        assert await served_by(url) == "base"  # ejected: not even tried
        assert state.decisions.recent[-1]["reason"] == "failover" and flaky.posts == 3

        await asyncio.sleep(0.4)
        assert shown(await scrape(url), backend.name) == (1, 1, 1)  # half-open
        assert (await status_of(url, "spec"))["breaker"]["state"] == "half_open"
        assert await served_by(url) == "base"  # the trial failed: retried
        assert flaky.posts == 4
        assert backend.breaker.state is OPEN and backend.breaker.cool_down == 0.8

        flaky.answer = "ok"
        await asyncio.sleep(0.4)
        assert backend.breaker.state is OPEN  # still: twice as long this time
        await asyncio.sleep(0.4)
        assert await served_by(url) == "spec"  # the trial worked: readmitted
        assert backend.breaker.state is CLOSED
        assert [await served_by(url) for _ in range(3)] == ["spec"] * 3
        await settled(state)
        assert state.inflight() == 0
        text = await scrape(url)
    assert shown(text, backend.name) == (0, 1, 2)
    assert shown(text, state.roster.backends[1].name) == (0, 1, 0)
    assert samples(text, "specroute_upstream_errors_total") == {
        (("backend", backend.name), ("kind", "connect")): 4
    }
    assert all(v == 0 for v in samples(text, "specroute_inflight").values())
    assert samples(text, "specroute_background_errors_total") == {
        (("task", "health"),): 0,
        (("task", "poll"),): 0,
        (("task", "online"),): 0,  # the live curves' fit, in the default observe mode
    }


async def test_failed_health_checks_eject_only_in_a_row(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Two failed checks in a row (the endpoint answers garbage, then 500) eject nothing
    when three are the rule; three in a row do (503, garbage, 500), and after the
    cool-down the next check, passing, readmits. The checks go on through all of it."""
    flaky = RawBackend()
    async with (
        flaky.serving() as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(
            spec=[spec],
            base=[base],
            crossover=8,
            health_interval=0.05,
            eject_after_failures=3,
            eject_seconds=0.3,
        ) as (url, state),
    ):
        backend = state.roster.backends[0]

        async def states_until_probed(more: int) -> set[BreakerState]:
            seen, until = set(), flaky.probes + more
            for _ in range(400):
                seen.add(backend.breaker.state)
                if flaky.probes >= until:
                    return seen
                await asyncio.sleep(0.005)
            raise AssertionError(f"{more} health checks did not come")

        flaky.health.extend(["garbage", "500"])
        assert await states_until_probed(4) == {CLOSED}
        assert backend.breaker.ejections == 0
        assert await served_by(url) == "spec"

        flaky.health.extend(["503", "garbage", "500"])
        assert await states_until_probed(4) == {CLOSED, OPEN}
        assert await served_by(url) == "base"
        assert state.decisions.recent[-1]["reason"] == "failover"
        assert CLOSED in await states_until_probed(10)
        assert f"{backend.name} readmitted (health check)" in caplog.text
        assert await served_by(url) == "spec"
        text = await scrape(url)
    assert shown(text, backend.name) == (0, 1, 1)
    assert samples(text, "specroute_upstream_errors_total") == {
        (("backend", backend.name), ("kind", "health")): 5
    }
    assert sum(samples(text, "specroute_background_errors_total").values()) == 0


@asynccontextmanager
async def scraped_as_told() -> AsyncIterator[tuple[str, list[bytes], list[int]]]:
    """A backend that passes its health checks and answers ``/metrics`` with the last of a
    list of bodies; yields its URL, that list and how many scrapes it answered."""
    bodies, scrapes = [b""], [0]

    async def metrics(request: web.Request) -> web.Response:
        scrapes[0] += 1
        return web.Response(body=bodies[-1], content_type="text/plain")

    async def health(request: web.Request) -> web.Response:
        return web.Response()

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/health", health)
    async with serving(app) as url:
        yield url, bodies, scrapes


async def test_garbage_metrics_neither_stop_polling_nor_routing() -> None:
    """Bytes that are not UTF-8, then NaN and infinite counts: polling goes on, requests
    are routed, status and metrics answer, and the good numbers that follow are read.
    Each scrape that yielded nothing is counted as the poll's; no task failed."""
    async with (
        scraped_as_told() as (spec, bodies, scrapes),
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], policy="always-base", poll_interval=0.02) as (
            url,
            state,
        ),
    ):

        async def scraped(more: int) -> None:
            until = scrapes[0] + more
            for _ in range(300):
                if scrapes[0] >= until:
                    return
                await asyncio.sleep(0.01)
            raise AssertionError("polling stopped")

        for body in (
            b"\xff\xfe\x00sglang:num_running_reqs \xc3\x28\n",
            b"sglang:num_running_reqs NaN\nsglang:num_queue_reqs +Inf\n",
        ):
            bodies.append(body)
            await scraped(3)
            assert await served_by(url) == "base"
            assert (await status_of(url, "spec"))["running"] is None
            await scrape(url)
        bodies.append(
            b"# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs 2\n"
            b"sglang:num_queue_reqs 1\n"
        )
        await scraped(3)
        spec_status = await status_of(url, "spec")
        text = await scrape(url)
    assert (spec_status["running"], spec_status["queued"]) == (2, 1)
    errors = {
        dict(labels)["task"]: n
        for labels, n in samples(text, "specroute_background_errors_total").items()
    }
    assert errors.pop("poll") >= 6 and set(errors.values()) == {0}
    first = (("backend", state.roster.backends[0].name),)
    assert samples(text, "specroute_backend_healthy")[first] == 1


async def test_out_of_file_descriptors_a_health_check_blames_the_router(tmp_path: Path) -> None:
    """The router's open-files limit lowered under it until its health checks cannot open a
    socket: the router's own failure, counted as such, which ejects no backend even where
    one failure would."""
    spec_backend = RawBackend()  # it closes every connection: each check needs a socket
    config = tmp_path / "router.toml"
    config.write_text("health_interval = 0.05\neject_after_failures = 1\n")
    async with (
        spec_backend.serving() as spec,
        running_emulator("--mode", "base", "--time-scale", "0.5") as base,
        spawned(
            "serve",
            "--spec",
            spec,
            "--base",
            base,
            "--policy",
            "always-base",
            "--config",
            str(config),
            stop=signal.SIGKILL,
        ) as router,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s,
    ):
        pid = router.process.pid
        room = len(os.listdir(f"/proc/{pid}/fd")) + 2 * 6
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (room, room))
        held: list[aiohttp.ClientResponse] = []
        for _ in range(24):  # streams while the router can take them
            try:
                post = s.post(f"{router.url}/v1/chat/completions", json=LONG_STREAM)
                held.append(await asyncio.wait_for(post, 2))
            except (aiohttp.ClientError, TimeoutError):  # refused at its last descriptor
                break
        idle: list[asyncio.StreamWriter] = []  # then bare connections, until none is left
        host, port = router.url.removeprefix("http://").rsplit(":", 1)
        for _ in range(24):
            if not (spare := await _spare_descriptors(pid, room)):
                break
            for _ in range(spare):
                idle.append((await asyncio.open_connection(host, int(port)))[1])
        await asyncio.sleep(1.2)  # asyncio retries an accept that found no descriptor
        full = await _spare_descriptors(pid, room) == 0
        probes = spec_backend.probes
        await asyncio.sleep(0.5)  # ten rounds of health checks
        starved = spec_backend.probes - probes
        for r in held:  # their descriptors come back to the router
            r.close()
        for w in idle:
            w.close()
        await asyncio.sleep(1.2)  # asyncio retries an accept that failed a second later
        async with s.get(f"{router.url}/metrics", timeout=aiohttp.ClientTimeout(10)) as r:
            text = await r.text()
        probes = spec_backend.probes
        await asyncio.sleep(0.2)
        checked_again = spec_backend.probes - probes
    name = (("backend", f"spec:127.0.0.1:{spec.rsplit(':', 1)[1]}"),)
    assert held and full and starved <= 1 and checked_again >= 2
    assert samples(text, "specroute_router_errors_total")[(("kind", "out_of_fds"),)] >= 5
    assert samples(text, "specroute_upstream_errors_total") == {}
    assert samples(text, "specroute_backend_ejections_total")[name] == 0
    assert samples(text, "specroute_backend_healthy")[name] == 1
