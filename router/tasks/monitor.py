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
from pathlib import Path
from typing import Literal

import aiohttp
import orjson

from specroute.router.backends.backend import LOADS_PATHS, Backend, Front
from specroute.router.backends.discovery import Discovery
from specroute.router.operator.loads import VERSION
from specroute.router.protocol.content_coding import read_decoded
from specroute.router.protocol.outcome import Outcome, out_of_fds
from specroute.router.state import RouterState
from specroute.server_metrics import BackendStats, parse, parse_loads, with_loads

_log = logging.getLogger("specroute.router")

Task = Literal["health", "poll", "follow", "discovery"]
FOLLOW_INTERVAL = 0.25  # seconds: how often a worker starting looks for the first verdicts
# A worker follows what the others publish before each decision (``RouterState.view``);
# this loop is for one that serves nothing meanwhile, and for what shows with no event (a
# cool-down's end, on the breaker gauges; the CPU time): once a second, not four times,
# since each wake of an idle worker costs CPU that every worker would pay.
QUIET_FOLLOW_INTERVAL = 1.0
Job = Callable[[RouterState, Backend], Awaitable[None]]


async def check_health(state: RouterState, backend: Backend) -> None:
    assert state.session is not None
    timeout = aiohttp.ClientTimeout(total=state.settings.health.timeout)
    try:
        async with state.session.get(backend.url + backend.health_path, timeout=timeout) as r:
            ok = r.status == 200
    except (aiohttp.ClientError, TimeoutError) as exc:
        if _router_out_of_fds(state, exc):
            return  # the router's own failure says nothing of the backend
        ok = False
    if not ok:
        state.metrics.upstream_errors.labels(backend=backend.name, kind="health").inc()
    state.health_checked(backend, ok)


async def poll_metrics(state: RouterState, backend: Backend) -> None:
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
        status, answer = await _get(state, backend, path)
        if status == 404:
            backend.loads_missing()
        if answer:
            try:
                parsed = orjson.loads(answer)
            except ValueError:
                parsed = None
            loads = parse_loads(parsed)
            if loads is None:
                _unreadable(state, backend, path, "not SGLang's loads")
            else:
                backend.front = _front(path, parsed)
    stats = None
    if backend.front is None:
        _, body = await _get(state, backend, "/metrics")
        if body:
            # The text format is UTF-8 whatever the header says; bytes that are not become
            # U+FFFD, and the reader skips the lines they spoil.
            stats = parse(body.decode("utf-8", errors="replace"))
            if stats.empty:
                _unreadable(state, backend, "/metrics", "no number of SGLang's or vLLM's")
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
        await _read_adaptive(state, backend)
    backend.record_stats(stats, time.monotonic(), state.settings.health.stale_after)


async def _read_adaptive(state: RouterState, backend: Backend) -> None:
    """Whether an SGLang speculative server adapts its own depth (``--speculative-adaptive``),
    from its ``/server_info``, read once it answers, and again after a poll it did not answer
    (it may have been started again with other flags); one that does not say so does not.
    An answer that does not read leaves it unknown, to be asked again at the next poll."""
    _, answer = await _get(state, backend, "/server_info")
    try:
        info = orjson.loads(answer) if answer else None
    except ValueError:
        info = None
    if not isinstance(info, dict):
        if answer:
            _unreadable(state, backend, "/server_info", "not a JSON object")
        return
    backend.adaptive = info.get("speculative_adaptive") is True


def _front(path: str, answer: object) -> Front | None:
    """What a loads answer says stands there: SMG (its ``/get_loads``), a specroute (its
    version), or None for a server."""
    if path == LOADS_PATHS[1]:
        return "smg"
    said = answer.get("version") if isinstance(answer, dict) else None
    return "specroute" if isinstance(said, str) and said.startswith(VERSION) else None


def _unreadable(state: RouterState, backend: Backend, path: str, why: str) -> None:
    """Counted each time (``specroute_background_errors_total{task="poll"}``), logged when
    it starts or changes."""
    state.metrics.background_errors.labels(task="poll").inc()
    problem = f"{path}: {why}"
    if backend.poll_problem != problem:
        backend.poll_problem = problem
        _log.warning("Cannot read %s from %s (%s); its readings go stale.", path, backend.name, why)


async def _get(state: RouterState, backend: Backend, path: str) -> tuple[int, bytes | None]:
    """The status and, if 200, the body, decompressed; (0, None) when no answer came in a
    poll's time. The session leaves bodies as sent (the proxy relays them so), and SGLang
    compresses ``/metrics`` for a client that accepts it."""
    assert state.session is not None
    timeout = aiohttp.ClientTimeout(total=max(state.settings.health.poll_interval, 1.0))
    headers = {"Accept-Encoding": "gzip, deflate"}
    try:
        async with state.session.get(backend.url + path, timeout=timeout, headers=headers) as r:
            if r.status != 200:
                return r.status, None
            body = await read_decoded(r)
    except (aiohttp.ClientError, TimeoutError) as exc:
        _router_out_of_fds(state, exc)  # counted if so
        return 0, None
    except ValueError as exc:  # a coding not read here, or a body it does not decode
        _unreadable(state, backend, path, str(exc))
        return 200, None
    return 200, body


async def follow(state: RouterState) -> None:
    """One of several workers: what the others publish, applied here, until cancelled."""
    state.metrics.background_errors.labels(task="follow")  # 0 from the start
    while True:
        await asyncio.sleep(QUIET_FOLLOW_INTERVAL)
        try:
            state.follow()
        except Exception:  # a posted profile that no longer reads: a bug to see, not a stop
            state.metrics.background_errors.labels(task="follow").inc()
            _log.exception("Following the other workers failed; it goes on.")


async def discover(state: RouterState, discovery: Discovery, at_start: bool = False) -> None:
    """The leader: the servers as the sources give them now. One new to the router is
    checked before it is routed to, so that one not up yet joins ejected."""
    before = [(b.name, b.group) for b in state.roster.backends]
    placed, new = state.roster.place(await discovery.servers(at_start))
    await asyncio.gather(*(_guarded("health", state, check_health, b) for b in new))
    if at_start or [(b.name, b.group) for b in placed] != before:  # a group moved, too
        state.route_between(placed)  # (at start: published, for the workers waiting on it)


async def rediscover(state: RouterState, discovery: Discovery) -> None:
    """Discovery every ``watch_interval``, until cancelled."""
    state.metrics.background_errors.labels(task="discovery")  # 0 from the start
    while True:
        await asyncio.sleep(state.settings.backends.watch_interval)
        try:
            await discover(state, discovery)
        except Exception:
            state.metrics.background_errors.labels(task="discovery").inc()
            _log.exception("Discovery failed; it goes on.")


async def watch_profile(state: RouterState, path: Path) -> None:
    """Every worker: the profile file read every ``watch_interval``, adopted when it changes
    (a mounted ConfigMap: every replica changes together)."""
    failures = state.metrics.watch_failures.labels(source="profile_file")  # 0 from the start
    while True:
        await asyncio.sleep(state.settings.backends.watch_interval)
        if state.in_force.reread(path) and state.board.leader:  # counted once for the router
            failures.inc()


async def first_verdicts(state: RouterState) -> None:
    """A worker other than the leader starts serving once the leader's first health round
    is in (as the leader does), and its first set of backends if it discovers them, or
    after the time these may take."""
    board, settings = state.board, state.settings
    deadline = time.monotonic() + settings.health.timeout + 1.0
    if settings.backends.discovers():
        deadline += settings.health.timeout  # the discovered servers' checks come first
    while time.monotonic() < deadline:
        if settings.backends.discovers() and not board.servers_published():
            await asyncio.sleep(FOLLOW_INTERVAL)
            continue
        state.follow()
        if all(board.verdict(b.index)[0] for b in state.roster.backends):
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
    await asyncio.gather(*(_guarded(task, state, job, b) for b in state.roster.backends))


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
