"""Background work owned by the app: health checks and metric polling of every backend,
done by the leader (the only worker, or worker 0 of several) for all; the other workers
follow the health verdicts it publishes on the board.

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

Task = Literal["health", "poll", "follow"]
FOLLOW_INTERVAL = 0.25  # seconds: how late a worker may learn what another published
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


async def watch_silence(state: RouterState) -> None:
    """End a stream whose backend has sent nothing for ``idle_timeout`` while the relay
    waited for it, as aiohttp's read timeout would (the relay then says so to the client
    and counts the backend's ``timeout``); one look at every stream a tick."""
    idle = state.settings.idle_timeout
    tick = min(1.0, idle / 4)
    while True:
        await asyncio.sleep(tick)
        now = time.monotonic()
        for upstream, flight in list(state.upstreams.items()):
            if not flight.stream:
                continue  # a whole answer has its deadline
            received = upstream.content.total_bytes
            if received != flight.received or not flight.reading:
                flight.received, flight.quiet_since = received, now
            elif now - flight.quiet_since > idle:
                silent = aiohttp.ServerTimeoutError(f"no data for {idle:g} s")
                upstream.content.set_exception(silent)


async def follow(state: RouterState) -> None:
    """One of several workers: what the others publish, applied here, until cancelled."""
    state.metrics.background_errors.labels(task="follow")  # 0 from the start
    while True:
        await asyncio.sleep(FOLLOW_INTERVAL)
        try:
            state.follow()
        except Exception:  # a posted profile that no longer reads: a bug to see, not a stop
            state.metrics.background_errors.labels(task="follow").inc()
            _log.exception("Following the other workers failed; it goes on.")


async def first_verdicts(state: RouterState) -> None:
    """A worker other than the leader starts serving once the leader's first health round
    is in (as the leader does), or after the time that round may take."""
    deadline = time.monotonic() + state.settings.health_timeout + 1.0
    while time.monotonic() < deadline:
        if all(b.board.verdict(b.index)[0] for b in state.backends):
            break
        await asyncio.sleep(FOLLOW_INTERVAL)
    state.follow()


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
