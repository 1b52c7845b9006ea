"""The leader's health checks and metric polls of every backend (the only worker, or worker
0 of several), for all: the other workers follow the health verdicts it publishes on the
board. What they use of the router is ``Polling``, not its state.

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
from dataclasses import dataclass
from typing import Literal

import aiohttp
import orjson

from specroute.router.backends.asking import Asking
from specroute.router.backends.backend import LOADS_PATHS, SPECROUTE_VERSION, Backend, Front
from specroute.router.metrics import RouterMetrics
from specroute.router.protocol.content_coding import read_decoded
from specroute.router.protocol.outcome import Outcome, out_of_fds
from specroute.server_metrics import BackendStats, parse, parse_loads, with_loads

_log = logging.getLogger("specroute.router")

Task = Literal["health", "poll", "follow", "discovery"]


@dataclass(frozen=True)
class Polling:
    """What the checks and polls use: the servers and the session to ask them with, the
    counters of what failed, where a check's verdict goes (published for every worker's
    breaker, the leader's first), and the health settings' times."""

    asking: Asking
    metrics: RouterMetrics
    checked: Callable[[Backend, bool], None]
    health_timeout: float  # seconds a health check may take
    poll_timeout: float  # seconds a poll may take
    stale_after: float  # seconds a reading stands


Job = Callable[[Polling, Backend], Awaitable[None]]


async def check_health(polling: Polling, backend: Backend) -> None:
    session, timeout = polling.asking.client(), aiohttp.ClientTimeout(total=polling.health_timeout)
    try:
        async with session.get(backend.url + backend.health_path, timeout=timeout) as r:
            ok = r.status == 200
    except (aiohttp.ClientError, TimeoutError) as exc:
        if _router_out_of_fds(polling, exc):
            return  # the router's own failure says nothing of the backend
        ok = False
    if not ok:
        polling.metrics.upstream_errors.labels(backend=backend.name, kind="health").inc()
    polling.checked(backend, ok)


async def poll_metrics(polling: Polling, backend: Backend) -> None:
    """The backend's load from ``/v1/loads`` (SGLang's, current with
    ``--load-snapshot-publish-interval 1``, else a snapshot every 15 decode steps), else
    from the ``/metrics`` gauges, and its counters from ``/metrics``. A backend that
    answers 404 to ``/v1/loads`` is asked SMG's ``/get_loads`` instead (the same shape,
    one entry per server behind the gateway), and after a 404 there too (an older SGLang,
    vLLM) neither again. A gateway in front of servers (an SMG, or another specroute, whose
    ``/v1/loads`` names its version) is health-checked at its readiness from then on, and
    its ``/metrics``, not an engine's, is not read. An answer that is not empty but yields
    nothing is an unreadable one: counted, logged, and the readings go stale."""
    loads = None
    path = backend.loads_path
    if path is not None:
        status, answer = await _get(polling, backend, path)
        if status == 404:
            backend.loads_missing()
        if answer:
            try:
                parsed = orjson.loads(answer)
            except ValueError:
                parsed = None
            loads = parse_loads(parsed)
            if loads is None:
                _unreadable(polling, backend, path, "not SGLang's loads")
            else:
                backend.front = _front(path, parsed)
    stats = None
    if backend.front is None:
        _, body = await _get(polling, backend, "/metrics")
        if body:
            # The text format is UTF-8 whatever the header says; bytes that are not become
            # U+FFFD, and the reader skips the lines they spoil.
            stats = parse(body.decode("utf-8", errors="replace"))
            if stats.empty:
                _unreadable(polling, backend, "/metrics", "no number of SGLang's or vLLM's")
                stats = None
    if stats is None and loads is None:
        backend.adaptive = None  # asked again once it answers: it may come back otherwise
        return  # the readings go stale
    read_metrics = stats is not None or backend.front is not None
    if read_metrics and (loads is not None or not backend.serves_loads):
        backend.poll_problem = None
    stats = stats or BackendStats()
    if loads is not None:
        stats = with_loads(stats, loads)
    if backend.adaptive is None and backend.pool == "spec" and stats.engine == "sglang":
        await _read_adaptive(polling, backend)
    backend.record_stats(stats, time.monotonic(), polling.stale_after)


async def _read_adaptive(polling: Polling, backend: Backend) -> None:
    """Whether an SGLang speculative server adapts its own depth (``--speculative-adaptive``),
    from its ``/server_info``, read once it answers, and again after a poll it did not answer
    (it may have been started again with other flags); one that does not say so does not.
    An answer that does not read leaves it unknown, to be asked again at the next poll."""
    _, answer = await _get(polling, backend, "/server_info")
    try:
        info = orjson.loads(answer) if answer else None
    except ValueError:
        info = None
    if not isinstance(info, dict):
        if answer:
            _unreadable(polling, backend, "/server_info", "not a JSON object")
        return
    backend.adaptive = info.get("speculative_adaptive") is True


def _front(path: str, answer: object) -> Front | None:
    """What a loads answer says stands there: SMG (its ``/get_loads``), a specroute (its
    version), or None for a server."""
    if path == LOADS_PATHS[1]:
        return "smg"
    said = answer.get("version") if isinstance(answer, dict) else None
    return "specroute" if isinstance(said, str) and said.startswith(SPECROUTE_VERSION) else None


def _unreadable(polling: Polling, backend: Backend, path: str, why: str) -> None:
    """Counted each time (``specroute_background_errors_total{task="poll"}``), logged when
    it starts or changes."""
    polling.metrics.background_errors.labels(task="poll").inc()
    problem = f"{path}: {why}"
    if backend.poll_problem != problem:
        backend.poll_problem = problem
        _log.warning("Cannot read %s from %s (%s); its readings go stale.", path, backend.name, why)


async def _get(polling: Polling, backend: Backend, path: str) -> tuple[int, bytes | None]:
    """The status and, if 200, the body, decompressed; (0, None) when no answer came in a
    poll's time. The session leaves bodies as sent (the proxy relays them so), and SGLang
    compresses ``/metrics`` for a client that accepts it."""
    session = polling.asking.client()
    timeout = aiohttp.ClientTimeout(total=polling.poll_timeout)
    headers = {"Accept-Encoding": "gzip, deflate"}
    try:
        async with session.get(backend.url + path, timeout=timeout, headers=headers) as r:
            if r.status != 200:
                return r.status, None
            body = await read_decoded(r)
    except (aiohttp.ClientError, TimeoutError) as exc:
        _router_out_of_fds(polling, exc)  # counted if so
        return 0, None
    except ValueError as exc:  # a coding not read here, or a body it does not decode
        _unreadable(polling, backend, path, str(exc))
        return 200, None
    return 200, body


def _router_out_of_fds(polling: Polling, exc: BaseException) -> bool:
    """Whether the router had no file descriptor left for the socket (aiohttp wraps the
    OSError, errno kept); counted as the router's failure."""
    if not out_of_fds(exc):
        return False
    polling.metrics.router_errors.labels(kind=Outcome.OUT_OF_FDS).inc()
    return True


async def each_backend(task: Task, polling: Polling, job: Job) -> None:
    """One round: ``job`` on every backend at once, each guarded."""
    await asyncio.gather(*(guarded(task, polling, job, b) for b in polling.asking.backends))


async def every(interval: float, task: Task, polling: Polling, job: Job) -> None:
    """Run one job on all backends at a fixed interval, until cancelled."""
    polling.metrics.background_errors.labels(task=task)  # 0 from the start
    while True:
        started = time.monotonic()
        await each_backend(task, polling, job)
        await asyncio.sleep(max(0.0, interval - (time.monotonic() - started)))


async def guarded(task: Task, polling: Polling, job: Job, backend: Backend) -> None:
    """``job`` on ``backend``; what it raises is logged and counted, not raised."""
    try:
        await job(polling, backend)
    except Exception:  # not the backend's answer, which the job handles: a bug to see
        polling.metrics.background_errors.labels(task=task).inc()
        _log.exception("The %s task failed on %s; it goes on.", task, backend.name)
