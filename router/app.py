"""``create_app(settings)``: the router as an aiohttp application, no globals."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specroute.background import cancel_and_wait
from specroute.online.estimator import Online, OnlineMode
from specroute.policies.profile import Profile, load_profile
from specroute.policies.registry import build_policy
from specroute.router.admission.auth import Keys, without_credentials
from specroute.router.admission.limits import Admission
from specroute.router.admission.rate_limit import RateLimit
from specroute.router.backends.backend import LOADS_PATHS
from specroute.router.backends.discovery import Discovery, Resolve, resolve_ipv4
from specroute.router.backends.polls import check_health, each_backend, every, poll_metrics
from specroute.router.backends.roster import Roster
from specroute.router.backends.verdicts import Verdicts
from specroute.router.components import ejection, exploration, samples, sureness
from specroute.router.http.aiohttp_handler import proxied
from specroute.router.http.middleware import front
from specroute.router.metrics import RouterMetrics
from specroute.router.observability.access_log import LOG as ACCESS_LOG
from specroute.router.observability.access_log import stamp
from specroute.router.observability.decision_log import DecisionLog
from specroute.router.observability.lifecycle import Lifecycle
from specroute.router.observability.tracing import Tracing
from specroute.router.online.peer_answer import SAMPLES_PATH
from specroute.router.online.peers import Peers
from specroute.router.online.rings import Rings
from specroute.router.operator.answers import (
    Alive,
    BackendShown,
    BreakerShown,
    LiveConcurrency,
    ModelList,
    PolicyShown,
    ProfilePosted,
    ProfileShown,
    Ready,
    RouterStatus,
    WorkerShown,
)
from specroute.router.operator.cache_flush import PATH as FLUSH_PATH
from specroute.router.operator.cache_flush import flush_cache
from specroute.router.operator.engine_profile import START as PROFILE_START
from specroute.router.operator.engine_profile import STOP as PROFILE_STOP
from specroute.router.operator.engine_profile import start_profile, stop_profile
from specroute.router.operator.gauges import RouterGauges
from specroute.router.operator.live_profile_endpoint import LIVE_PROFILE_PATH, live_profile_endpoint
from specroute.router.operator.loads import loads
from specroute.router.operator.model_card import model_card
from specroute.router.operator.openapi import document
from specroute.router.operator.request_abort import PATH as ABORT_PATH
from specroute.router.operator.request_abort import abort_request
from specroute.router.operator.samples_endpoint import online_samples_endpoint
from specroute.router.operator.server_info import MODEL_INFO, SERVER_INFO, relay_info
from specroute.router.policy_in_force import PolicyInForce, digest_of
from specroute.router.processes import Workers, quota_of
from specroute.router.protocol.content_coding import read_decoded
from specroute.router.protocol.errors import error_response
from specroute.router.protocol.request_id import Tagged
from specroute.router.proxy.handler import PROXIED
from specroute.router.proxy.listeners import listeners
from specroute.router.proxy.proxying import PROXYING, Attempting, Choosing, Proxying
from specroute.router.proxy.stored_responses import PATH as RESPONSES_PATH
from specroute.router.proxy.stored_responses import StoredResponses, stored
from specroute.router.settings import RouterSettings
from specroute.router.state import STATE, RouterState
from specroute.router.tasks.monitor import (
    discover,
    first_verdicts,
    follow,
    rediscover,
    watch_profile,
)
from specroute.router.tasks.online_fits import fitter, keep_fitting, shares_gpus
from specroute.router.upstream.answer import Dropped
from specroute.router.upstream.pool import UpstreamPool
from specroute.router.workers.board import Board
from specroute.router.workers.sync import WorkerSync

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _ClientFault(logging.Filter):
    """aiohttp logs a request it could not parse, or whose body it could not decode, as an
    error with a traceback and an exception that quotes the bad line, the key in an
    ``Authorization`` header too: the client's fault, said in one line without them."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError | web.RequestPayloadError):
            record.msg = f"{record.msg}: {type(exc).__name__}"
            record.exc_info, record.exc_text = None, None
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


_HTTP_LOG = logging.getLogger("specroute.router.http")
_HTTP_LOG.addFilter(_ClientFault())
for _logger in (_HTTP_LOG, logging.getLogger("specroute.router")):
    _logger.addFilter(Tagged())  # a line made while a request is handled names it


def build_state(
    settings: RouterSettings, workers: Workers | None = None, resolve: Resolve = resolve_ipv4
) -> RouterState:
    """The router's state; ``workers``: the board and metrics folder this worker shares
    with the others, if it is one of several."""
    path = settings.routing.profile
    profile: Profile | None = None if path is None else load_profile(path)
    policy = build_policy(settings.routing.policy, settings.policy_params(), profile)
    source = None if path is None else str(path)
    digest = b"" if path is None else digest_of(path.read_bytes())  # what the watch compares with
    board = Board(1, settings.backends.columns()) if workers is None else workers.board
    metrics = RouterMetrics(None if workers is None else str(workers.folder))
    quota = quota_of(settings) if workers is None else workers.quota
    keys = Keys(settings.admission.api_keys, settings.admin_key)
    rate = settings.admission.rate_limit
    kept = settings.online.kept()
    off = settings.online.mode is OnlineMode.OFF
    alone = None if off else Rings(1, kept)  # one worker's log of its samples, for peers
    rings = alone if workers is None else workers.rings
    online = Online(
        settings.online.mode,
        samples(settings.online),
        sureness(settings.online),
        per_level=settings.online.window_samples,
        rings=rings,
        leads=board.leader,
        source=settings.routing.concurrency_source,
        accept_tolerance=settings.online.accept_tolerance,
        at_prefill=settings.online.at_prefill,
    )
    online.shared = shares_gpus(policy)  # as each fit finds it; exploration counts load so
    state = RouterState(
        settings,
        metrics,
        board,
        Roster(board, ejection(settings.health), settings.backends.servers()),
        PolicyInForce(policy, profile, source, settings.policy_params(), digest),
        WorkerSync(board, None if workers is None else workers.folder),
        Verdicts(metrics, board),
        DecisionLog(metrics, settings.observability.recent_decisions),
        Admission(quota, metrics, settings.admission.queue_size, settings.admission.queue_timeout),
        online,
        exploration(settings.online, online),
        None
        if rate is None
        else RateLimit(keys, quota, metrics, rate, settings.admission.rate_limit_burst),
        None if (otlp := settings.observability.otlp_traces_endpoint) is None else Tracing(otlp),
        peers=_peers(settings, metrics, online, rings, resolve),
        rings=rings,
        resolve=resolve,
    )
    state.lifecycle = Lifecycle(
        listeners(
            state.decisions,
            state.verdicts,
            online,
            settings.health.stale_after,
            state.rids,
            state.tracing is not None,
            settings.observability.access_log,
        )
    )
    metrics.exposed.register(RouterGauges(state.watching))
    return state


def _peers(
    settings: RouterSettings,
    metrics: RouterMetrics,
    online: Online,
    rings: Rings | None,
    resolve: Resolve,
) -> Peers | None:
    """The peer replicas the leader takes samples from, if any are given; their names
    resolved as often as the backends'."""
    if not settings.online.peers or not online.fitting or rings is None:
        return None
    window, every = settings.online.window_seconds, settings.backends.watch_interval
    kept = settings.online.kept()
    return Peers(settings.online.peers, metrics, rings.epoch, window, kept, resolve, every)


def _proxying(state: RouterState) -> Proxying:
    """What the request path uses of ``state``, by step."""
    settings = state.settings
    choosing = Choosing(
        state.view,
        state.place,
        state.in_force,
        state.admission,
        state.rate_limit,
        lambda: state.draining,
        settings.admission.queue_at_capacity,
        state.placement.prefix_bytes,
        state.rids,
        StoredResponses(state.asking, state.owners),
        state.lifecycle,
    )
    attempting = Attempting(
        state.asking, state.relaying, state.online, state.metrics, state.background, state.lifecycle
    )
    return Proxying(choosing, attempting, state.tracing, settings.health.interval)


def _server_limits(settings: RouterSettings) -> dict[str, Any]:
    """What aiohttp's server enforces before the app sees a request: the head's size, and
    how long a connection may go without a whole head (aiohttp's keep-alive timer runs
    from the connection's start and from each answer, and a head trickling in does not
    reset it: the slowloris deadline as well as the idle one)."""
    return {
        "keepalive_timeout": settings.http.client_idle_timeout,
        "max_line_size": settings.http.max_header_bytes,
        "max_field_size": settings.http.max_header_bytes,
        "max_headers": settings.http.max_headers,
        "logger": _HTTP_LOG,
    }


def create_app(
    settings: RouterSettings, workers: Workers | None = None, resolve: Resolve = resolve_ipv4
) -> web.Application:
    """``resolve``: how names (``dns+``) of backends and peers become addresses; a test's
    may stand for the system's."""
    state = build_state(settings, workers, resolve)
    app = web.Application(
        middlewares=[  # one: each layer costs every request a coroutine of its own
            front(
                Keys(settings.admission.api_keys, settings.admin_key),
                settings.http.body_timeout,
                settings.observability.request_id_headers,
                state.lifecycle,
            )
        ],
        client_max_size=settings.http.max_body_bytes,
        handler_args=_server_limits(settings),  # so every runner serving the app has them
    )
    app[STATE] = state
    app[PROXYING] = proxying = _proxying(state)
    if settings.observability.access_log:
        ACCESS_LOG.setLevel(logging.INFO)  # its lines, whatever the level of the others
    app.on_response_prepare.append(stamp)

    # every route answers an expectation it cannot meet as an OpenAI-shaped 417
    get = functools.partial(app.router.add_get, expect_handler=_expectation)
    post = functools.partial(app.router.add_post, expect_handler=_expectation)
    route = functools.partial(app.router.add_route, expect_handler=_expectation)
    for path in PROXIED:
        post(path, proxied(proxying, settings.http.client_write_timeout))
    # the operator's asks of the servers, and what it reads: these, not the whole state
    asking, watching = state.asking, state.watching
    post(ABORT_PATH, functools.partial(abort_request, asking=asking))
    for method, stored_path in (("GET", ""), ("POST", "/cancel")):
        path = f"{RESPONSES_PATH}/{{response_id}}{stored_path}"
        route(method, path, functools.partial(stored, responses=proxying.choosing.stored))
    get("/v1/models", _models)
    get("/v1/models/{model:.+}", functools.partial(model_card, asking=asking))
    for names in (SERVER_INFO, MODEL_INFO):
        for name in names:
            get(name, functools.partial(relay_info, asking=asking, names=names))
    for path in LOADS_PATHS:  # SGLang's name, and SMG's
        get(path, functools.partial(loads, watching=watching))
    for method in ("GET", "POST"):  # SGLang takes either
        for path, handler in (
            (FLUSH_PATH, flush_cache),
            (PROFILE_START, start_profile),
            (PROFILE_STOP, stop_profile),
        ):
            route(method, path, functools.partial(handler, asking=asking))
    get("/health", _health)
    for path in ("/ready", "/health_generate"):  # SGLang's probe that a generation works
        get(path, _ready)
    get("/metrics", _metrics)
    get("/router/status", _status)
    post("/router/profile", _swap_profile)
    get(LIVE_PROFILE_PATH, functools.partial(live_profile_endpoint, watching=watching))
    get(
        SAMPLES_PATH,
        functools.partial(online_samples_endpoint, rings=state.rings, settings=settings.online),
    )
    get("/openapi.json", _openapi)
    app.cleanup_ctx.append(_background)
    return app


async def _expectation(request: web.Request) -> web.StreamResponse | None:
    """``Expect: 100-continue`` met as aiohttp's server meets it; any other refused."""
    if request.version < aiohttp.HttpVersion11:
        return None  # HTTP/1.0 knows no expectation
    if request.headers.get("Expect", "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the answer's size counts from its own head
        return None
    refused = error_response(417, "Only the expectation 100-continue is met here.")
    refused.force_close()  # its body, never asked for, is not read
    return refused


async def _background(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    settings = state.settings
    connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
    key = settings.upstream.api_key
    headers = {} if key is None else {"Authorization": f"Bearer {key.get_secret_value()}"}
    state.asking.session = session = aiohttp.ClientSession(
        connector=connector, auto_decompress=False, headers=headers
    )
    pool = state.relaying.pool = UpstreamPool(
        headers, settings.upstream.max_head_bytes, _dropped(state)
    )
    if state.board.leader:  # alone, or worker 0: health, polls and discovery for every worker
        state.follow()  # a leader started again: the set of backends it published before
        discovery = None
        if settings.backends.discovers():
            discovery = _discovery(state)
            await discover(state, discovery, at_start=True)  # a bad backends file stops here
        polling, health = state.polling, settings.health
        await each_backend("health", polling, check_health)  # before serving: one failing waits
        tasks = [
            asyncio.create_task(every(health.interval, "health", polling, check_health)),
            asyncio.create_task(every(health.poll_interval, "poll", polling, poll_metrics)),
        ]
        if discovery is not None:
            tasks.append(asyncio.create_task(rediscover(state, discovery)))
    else:
        await first_verdicts(state)
        tasks = []
    if settings.routing.profile is not None:
        tasks.append(asyncio.create_task(watch_profile(state, settings.routing.profile)))
    if state.online.fitting:  # alone, or the leader: from every worker's samples
        state.fitter = fitter()
        tasks.append(asyncio.create_task(keep_fitting(state)))
    if not state.sync.alone:  # one of several workers: what the others publish
        tasks.append(asyncio.create_task(follow(state)))
    yield
    for task in state.background:  # aborts of requests whose client left: not waited for
        task.cancel()
    if state.relaying.watchdog is not None:
        tasks.append(state.relaying.watchdog)
    await cancel_and_wait(tasks)
    if state.fitter is not None:
        state.fitter.shutdown(wait=False, cancel_futures=True)  # a fit under way ends alone
    await state.admission.stop()
    await session.close()
    pool.close()
    if state.tracing is not None:
        await state.tracing.close()


def _dropped(state: RouterState) -> Callable[[str, Dropped], None]:
    """What a backend sent that the pool dropped, counted by the backend's name (its URL
    while no backend has that URL: one removed since)."""
    dropped = state.metrics.upstream_dropped

    def told(base: str, reason: Dropped) -> None:
        named = (b.name for b in state.roster.backends if b.url == base)
        name = next(named, None) or without_credentials(base)
        if reason is not Dropped.INTERIM:
            _HTTP_LOG.warning("Closed a connection to %s: %s", name, reason)
        dropped.labels(backend=name, reason=reason).inc()

    return told


def _discovery(state: RouterState) -> Discovery:
    settings, failures = state.settings, state.metrics.watch_failures
    for source in ("dns", "backends_file"):
        failures.labels(source=source)  # 0 from the start
    return Discovery(
        settings.backends.servers(),
        settings.backends.names(),
        settings.backends.backends_file,
        lambda source: failures.labels(source=source).inc(),
        state.resolve,
    )


async def _models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    assert state.session is not None
    cards: dict[str, Any] = {}
    for backend in state.roster.backends:
        if not backend.healthy:
            continue
        try:
            async with state.session.get(f"{backend.url}/v1/models") as r:
                for card in json.loads(await read_decoded(r)).get("data", []):
                    cards.setdefault(card.get("id"), card)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            state.metrics.upstream_errors.labels(backend=backend.name, kind="models").inc()
    return web.json_response(ModelList(data=list(cards.values())).model_dump(mode="json"))


async def _health(request: web.Request) -> web.Response:
    return web.json_response(Alive().model_dump())


async def _openapi(request: web.Request) -> web.Response:
    return web.json_response(document())


async def _ready(request: web.Request) -> web.Response:
    """A backend whose health check passes (a generation, on SGLang) and no drain begun."""
    state = request.app[STATE]
    if state.stopping:
        return error_response(503, "draining", "service_unavailable")
    if not any(b.healthy for b in state.roster.backends):
        return error_response(503, "no healthy backend", "service_unavailable")
    return web.json_response(Ready().model_dump())


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].metrics.exposed)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _status(request: web.Request) -> web.Response:
    state = request.app[STATE]
    view, in_force = state.view(), state.in_force
    policy, profile = in_force.policy, in_force.profile
    stale, now = state.settings.health.stale_after, time.monotonic()
    status = RouterStatus(
        policy=PolicyShown(name=policy.name, parameters=policy.describe()),
        worker=WorkerShown(index=state.board.worker, of=state.board.workers),
        front=state.settings.http.front,
        concurrency_source=str(view.source),
        live_concurrency=LiveConcurrency(
            total=view.load(), spec=view.load("spec"), base=view.load("base")
        ),
        profile=None
        if profile is None
        else ProfileShown(
            source=in_force.source,
            created=profile.created,
            age_seconds=profile.age_seconds(),
            loaded_seconds_ago=time.time() - in_force.loaded_at,
            crossover=profile.raw.get("crossover"),
            contexts=list(profile.contexts),
            note=profile.crossover.note,
        ),
        backends=[
            BackendShown(
                name=b.name,
                url=without_credentials(b.url),
                pool=b.pool,
                group=b.group,
                healthy=b.healthy,
                breaker=BreakerShown(**b.breaker.describe()),
                inflight=b.inflight,
                kv_tokens_inflight=v.kv_tokens,
                running=v.running,
                queued=v.queued,
                accept_length=v.accept_length,
                accept_length_age_seconds=v.accept_length_age,
                spec_depth=None if (r := b.reading(stale, now)) is None else r.spec_depth,
                adaptive=None if r is None else r.adaptive,
            )
            for b, v in zip(state.roster.backends, view.backends, strict=True)
        ],
        online=state.online.describe(now)
        | {"exploration": None if (e := state.exploration) is None else e.describe()},
        recent_decisions=list(state.decisions.recent),
        tasks=len(asyncio.all_tasks()),
        draining=state.draining,
    )
    return web.json_response(status.model_dump(mode="json"))


async def _swap_profile(request: web.Request) -> web.Response:
    """Route by the posted profile from the next request on; none in flight is dropped.

    The crossover comes from the profile even when one was given at start."""
    state = request.app[STATE]
    try:
        state.post_profile(await request.json())
    except ValueError as exc:  # bad JSON, ProfileError and PolicyError alike
        return error_response(400, f"The profile was not loaded: {exc}")
    policy, profile = state.in_force.policy, state.in_force.profile
    assert profile is not None
    posted = ProfilePosted(
        policy=PolicyShown(name=policy.name, parameters=policy.describe()),
        profile={"created": profile.created, "crossover": profile.raw["crossover"]},
    )
    return web.json_response(posted.model_dump(mode="json"))
