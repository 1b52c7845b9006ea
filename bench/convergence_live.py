"""``specroute bench convergence --live``: a run of the convergence bench as a user deploys
it. The pair as ``specroute emulate`` processes sharing one GPU group's file at a time scale,
a ``specroute serve`` router in front with ``--online adopt`` and the start's crossover, and
the traffic sent through it: the Azure trace's requests by their arrival times
(``live_contender``), or the ramp's clients, each phase's for its time scaled
(``loadgen.trace_loop``), with the same prompts as the offline run.

The router's own clocks are wall seconds, so every setting that is a time (the fit's
interval, the window, the polls and health checks) is given times the time scale: the
router learns over the emulated seconds the offline run learns over. Its status is read at
each fit's interval: the bands it routes by (``online.fits[].adopted_bands``, else the
start's), and at the end what it explored. Times come back in emulated seconds; a run whose
servers could not keep their time, or whose router and client took more than a sliver of a
request's (``loadgen.lag.Kept``), says so, and nothing is concluded from it.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AsyncExitStack
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp

from specroute.bench.convergence import (
    OUTPUT_LEN,
    STARTS,
    Converged,
    defaults,
    first_edge,
    output_tps,
    replay_plan,
    scaled,
    settled,
    traffic_name,
    truth,
)
from specroute.bench.live_contender import STREAM_INTERVAL, emulated, replay_live
from specroute.bench.replay import ReplayPlan
from specroute.crossing import Band
from specroute.loadgen import lag
from specroute.loadgen.client import PhaseBodies, served_model
from specroute.loadgen.record import RequestRecord, mean_latency
from specroute.loadgen.request_trace import RequestTrace
from specroute.loadgen.spawn import NO_DRAIN, spawned
from specroute.loadgen.trace import Trace
from specroute.loadgen.trace_loop import play
from specroute.policies.view import POOLS
from specroute.router.settings import RouterSettings


async def converge_live(
    model: tuple[str, ...],
    start: str,
    traffic: RequestTrace | int,
    time_scale: float,
    folder: Path,
    at_prefill: bool | None = None,
) -> tuple[Converged, lag.Kept]:
    """One run from ``start`` on ``traffic`` live (a request trace, or the ramp this many
    times over), and how it kept its time (``loadgen.lag.Kept``); ``at_prefill``: the
    router's ``online_at_prefill`` (None: its default)."""
    known, factor, settings = truth(model), STARTS[start], defaults(at_prefill)
    plan = replay_plan(model, known, traffic, 0)
    seconds = plan.trace.seconds
    begin = 0.0 if factor is None else known.crossover * factor
    given = () if factor is None else scaled(known.bands, factor)
    scale = ("--time-scale", f"{time_scale:g}", "--stream-interval", STREAM_INTERVAL)
    shared = ("--share-gpus", str(folder / "gpus"), "--noise", "default")
    every = settings.online.interval * time_scale
    routing = _routing(folder, settings, time_scale, None if factor is None else begin)
    async with AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(
                spawned("emulate", *model, *shared, "--mode", pool, *scale)
            )
            for pool in POOLS
        ]
        backends = folder / "backends.json"
        targets = [
            {"targets": [p.url], "labels": {"pool": pool}}
            for pool, p in zip(POOLS, servers, strict=True)
        ]
        backends.write_text(json.dumps(targets))
        router = await stack.enter_async_context(
            spawned("serve", *NO_DRAIN, "--backends-file", str(backends), *routing)
        )
        urls = [p.url for p in servers]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            before = await lag.clocks(session, urls)
            polls: list[tuple[float, Any]] = []
            began = time.monotonic()
            watching = asyncio.create_task(_watch(session, router.url, every, polls))
            try:
                records = await _sent(session, router.url, plan, start, traffic, time_scale)
            finally:
                watching.cancel()
                await asyncio.gather(watching, return_exceptions=True)
            status = await _status(session, router.url)
            after = await lag.clocks(session, urls)
    timed = mean_latency(records)
    kept = lag.Kept(lag.overall(before, after), lag.elsewhere(before, after, timed, time_scale))
    routed = [((t - began) / time_scale, _routed(given, online)) for t, online in polls]
    adopted = next((t for t, online in routed if online is not given), None)
    at, outside = settled([(t, (b,)) for t, b in routed], (known,), adopted)
    end = routed[-1][1] if routed else given
    explored = (status.get("online") or {}).get("exploration") or {}
    return Converged(
        start,
        traffic_name(traffic),
        known,
        begin,
        seconds,
        len(records),
        at,
        None if at is None else sum(1 for r in records if r.start < at),
        outside,
        first_edge(end),
        sum(explored.get("explored", {}).values()),
        sum(explored.get("turns", {}).values()),
        output_tps(records, seconds),
        None,
        timed,
        None,
        end,
    ), kept


async def _sent(
    session: aiohttp.ClientSession,
    url: str,
    plan: ReplayPlan,
    start: str,
    traffic: RequestTrace | int,
    time_scale: float,
) -> list[RequestRecord]:
    """The traffic through the router at ``url``, its records' times in emulated seconds:
    the trace's requests at their arrivals, or the ramp's phases (``plan``, the offline
    run's), each for its time scaled, with the offline run's prompts."""
    name = f"convergence {start}"
    if not isinstance(traffic, int):
        return await replay_live(session, url, name, traffic, time_scale, traffic.seconds)
    phases = tuple(replace(p, seconds=p.seconds * time_scale) for p in plan.trace.phases)
    ramp = Trace(plan.trace.name, phases)
    served = await served_model(session, url)
    bodies = PhaseBodies(ramp, plan.dataset, served, True, OUTPUT_LEN)
    began, records = await play(session, url, bodies, ramp, name)
    return [emulated(r, began, time_scale) for r in records]


def _routing(
    folder: Path, settings: RouterSettings, time_scale: float, crossover: float | None
) -> list[str]:
    """The router's flags: a config in ``folder`` with ``online = "adopt"`` and every time
    setting scaled by ``time_scale``, and the start's crossover (None: no profile)."""
    timed = {
        "online_interval": settings.online.interval * time_scale,
        "online_window_seconds": settings.online.window_seconds * time_scale,
        "poll_interval": settings.health.poll_interval * time_scale,
        "stale_after": settings.health.stale_after * time_scale,
        "health_interval": settings.health.interval * time_scale,
    }
    config = folder / "router.toml"
    at_prefill = f"online_at_prefill = {str(settings.online.at_prefill).lower()}\n"
    lines = "".join(f"{k} = {v!r}\n" for k, v in timed.items())
    config.write_text('online = "adopt"\n' + at_prefill + lines)
    routing = ["--config", str(config)]
    if crossover is not None:
        routing += ["--policy-param", f"crossover={crossover!r}"]
    return routing


async def _watch(
    session: aiohttp.ClientSession, url: str, every: float, polls: list[tuple[float, Any]]
) -> None:
    """The router's online status, every ``every`` wall seconds, with its wall time."""
    while True:
        await asyncio.sleep(every)
        polls.append((time.monotonic(), (await _status(session, url)).get("online")))


async def _status(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/router/status") as answer:
        answer.raise_for_status()
        found: dict[str, Any] = await answer.json()
        return found


def _routed(given: tuple[Band, ...], online: Any) -> tuple[Band, ...]:
    """The bands a status says the router routes by: the first fit's adopted ones, else
    the start's (``given``, the same object: never adopted)."""
    fits = (online or {}).get("fits") or []
    adopted = fits[0].get("adopted_bands") if fits else None
    if adopted is None:
        return given
    return tuple((a, b) for a, b in adopted)
