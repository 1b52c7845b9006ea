"""Background work owned by the app: health checks and metric polling of every backend.

Each round runs its job on every backend, each guarded: an exception the job did not
expect is logged with its traceback, counted in ``specroute_background_errors_total{task}``,
and the next round comes as usual. A loop that died would leave routing on the health and
load it last saw, with nothing to say so.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import aiohttp

from specroute.router.backend import Backend
from specroute.router.backend_stats import parse
from specroute.router.outcome import Outcome, out_of_fds
from specroute.router.state import RouterState

_log = logging.getLogger("specroute.router")

Task = Literal["health", "poll"]
Job = Callable[[RouterState, Backend], Awaitable[None]]


async def check_health(state: RouterState, backend: Backend) -> None:
    assert state.session is not None
    timeout = aiohttp.ClientTimeout(total=state.settings.health_timeout)
    try:
        async with state.session.get(f"{backend.url}/health", timeout=timeout) as r:
            ok = r.status == 200
    except (aiohttp.ClientError, TimeoutError) as exc:
        if _router_out_of_fds(state, exc):
            return  # the router's own failure says nothing of the backend
        ok = False
    if not ok:
        state.metrics.upstream_errors.labels(backend=backend.name, kind="health").inc()
    state.health_checked(backend, ok)


async def poll_metrics(state: RouterState, backend: Backend) -> None:
    assert state.session is not None
    timeout = aiohttp.ClientTimeout(total=max(state.settings.poll_interval, 1.0))
    try:
        async with state.session.get(f"{backend.url}/metrics", timeout=timeout) as r:
            if r.status != 200:
                return
            body = await r.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        _router_out_of_fds(state, exc)  # counted if so; either way the stats go stale
        return
    # The text format is UTF-8 whatever the header says; bytes that are not become U+FFFD,
    # and the reader skips the lines they spoil.
    backend.record_stats(parse(body.decode("utf-8", errors="replace")), time.monotonic())
    m, stats = state.metrics, backend.stats
    assert stats is not None
    if stats.running is not None:
        m.running.labels(backend=backend.name).set(stats.running)
    if stats.queued is not None:
        m.queued.labels(backend=backend.name).set(stats.queued)
    if backend.accept_length is not None:
        m.accept_length.labels(backend=backend.name).set(backend.accept_length)


def _router_out_of_fds(state: RouterState, exc: BaseException) -> bool:
    """Whether the router had no file descriptor left for the socket (aiohttp wraps the
    OSError, errno kept); counted as the router's failure."""
    if not out_of_fds(exc):
        return False
    state.metrics.router_errors.labels(kind=Outcome.OUT_OF_FDS).inc()
    return True


async def each_backend(task: Task, state: RouterState, job: Job) -> None:
    """One round: ``job`` on every backend at once, each guarded."""
    await asyncio.gather(*(_guarded(task, state, job, b) for b in state.backends))


async def every(interval: float, task: Task, state: RouterState, job: Job) -> None:
    """Run one job on all backends at a fixed interval, until cancelled."""
    state.metrics.background_errors.labels(task=task)  # 0 from the start
    while True:
        started = time.monotonic()
        await each_backend(task, state, job)
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))


async def _guarded(task: Task, state: RouterState, job: Job, backend: Backend) -> None:
    try:
        await job(state, backend)
    except Exception:  # not the backend's answer, which the job handles: a bug to see
        state.metrics.background_errors.labels(task=task).inc()
        _log.exception("The %s task failed on %s; it goes on.", task, backend.name)
