"""Background work owned by the app: health checks and metric polling of every backend."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import aiohttp

from specroute.router.backend import Backend
from specroute.router.backend_stats import parse
from specroute.router.state import RouterState


async def check_health(state: RouterState, backend: Backend) -> None:
    assert state.session is not None
    timeout = aiohttp.ClientTimeout(total=state.settings.health_timeout)
    try:
        async with state.session.get(f"{backend.url}/health", timeout=timeout) as r:
            healthy = r.status == 200
    except (aiohttp.ClientError, TimeoutError):
        healthy = False
    if not healthy:
        state.metrics.upstream_errors.labels(backend=backend.name, kind="health").inc()
    backend.healthy = healthy
    state.metrics.healthy.labels(backend=backend.name).set(1 if healthy else 0)


async def poll_metrics(state: RouterState, backend: Backend) -> None:
    assert state.session is not None
    timeout = aiohttp.ClientTimeout(total=max(state.settings.poll_interval, 1.0))
    try:
        async with state.session.get(f"{backend.url}/metrics", timeout=timeout) as r:
            if r.status != 200:
                return
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return
    backend.record_stats(parse(text), time.monotonic())
    m, stats = state.metrics, backend.stats
    assert stats is not None
    if stats.running is not None:
        m.running.labels(backend=backend.name).set(stats.running)
    if stats.queued is not None:
        m.queued.labels(backend=backend.name).set(stats.queued)
    if backend.accept_length is not None:
        m.accept_length.labels(backend=backend.name).set(backend.accept_length)


Job = Callable[[RouterState, Backend], Awaitable[None]]


async def every(interval: float, state: RouterState, job: Job) -> None:
    """Run one job on all backends at a fixed interval, until cancelled."""
    while True:
        started = time.monotonic()
        await asyncio.gather(*(job(state, b) for b in state.backends))
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))
