"""``create_app(settings)``: the router as an aiohttp application, no globals."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specroute.policies.profile import Profile, load_profile, parse_profile
from specroute.policies.registry import build_policy
from specroute.router.auth import auth_middleware
from specroute.router.backend import Backend
from specroute.router.errors import error_response
from specroute.router.health import Breaker
from specroute.router.metrics import RouterMetrics
from specroute.router.monitor import check_health, each_backend, every, poll_metrics
from specroute.router.proxy import proxy
from specroute.router.settings import RouterSettings
from specroute.router.state import RouterState

STATE = web.AppKey("state", RouterState)
PROXIED = ("/v1/chat/completions", "/v1/completions", "/generate")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_state(settings: RouterSettings) -> RouterState:
    profile: Profile | None = load_profile(settings.profile) if settings.profile else None
    policy = build_policy(settings.policy, settings.policy_params(), profile)
    backends = [Backend(u, "spec", Breaker(settings.ejection())) for u in settings.spec] + [
        Backend(u, "base", Breaker(settings.ejection())) for u in settings.base
    ]
    state = RouterState(settings, backends, policy, profile, RouterMetrics())
    state.adopt(policy, profile, str(settings.profile) if settings.profile else None)
    return state


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPRequestEntityTooLarge as exc:
        return error_response(413, f"The request body is larger than the limit: {exc.text}")
    except web.HTTPNotFound:
        return error_response(404, f"Unknown path {request.path!r}.", "not_found")
    except web.HTTPMethodNotAllowed:
        return error_response(405, f"{request.method} is not allowed on {request.path!r}.")


def create_app(settings: RouterSettings) -> web.Application:
    state = build_state(settings)
    app = web.Application(
        middlewares=[_errors, auth_middleware(settings.api_keys, settings.admin_key)],
        client_max_size=settings.max_body_bytes,
    )
    app[STATE] = state

    async def forward(request: web.Request) -> web.StreamResponse:
        return await proxy(request, state)

    for path in PROXIED:
        app.router.add_post(path, forward)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/health", _health)
    app.router.add_get("/ready", _ready)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/router/status", _status)
    app.router.add_post("/router/profile", _swap_profile)
    app.cleanup_ctx.append(_background)
    return app


async def _background(app: web.Application) -> AsyncIterator[None]:
    state = app[STATE]
    settings = state.settings
    connector = aiohttp.TCPConnector(limit=0, enable_cleanup_closed=True)
    key = settings.backend_api_key
    headers = {} if key is None else {"Authorization": f"Bearer {key.get_secret_value()}"}
    state.session = aiohttp.ClientSession(
        connector=connector, auto_decompress=False, headers=headers
    )
    await each_backend("health", state, check_health)  # before serving: one that fails waits
    tasks = [
        asyncio.create_task(every(settings.health_interval, "health", state, check_health)),
        asyncio.create_task(every(settings.poll_interval, "poll", state, poll_metrics)),
    ]
    yield
    for task in (*tasks, *state.background):
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await state.session.close()


async def _models(request: web.Request) -> web.Response:
    state = request.app[STATE]
    assert state.session is not None
    cards: dict[str, Any] = {}
    for backend in state.backends:
        if not backend.healthy:
            continue
        try:
            async with state.session.get(f"{backend.url}/v1/models") as r:
                for card in (await r.json()).get("data", []):
                    cards.setdefault(card.get("id"), card)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            state.metrics.upstream_errors.labels(backend=backend.name, kind="models").inc()
    return web.json_response({"object": "list", "data": list(cards.values())})


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _ready(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.stopping:
        return error_response(503, "draining", "service_unavailable")
    if not any(b.healthy for b in state.backends):
        return error_response(503, "no healthy backend", "service_unavailable")
    return web.json_response({"status": "ready"})


async def _metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[STATE].metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _status(request: web.Request) -> web.Response:
    state = request.app[STATE]
    view = state.view()
    profile = state.profile
    return web.json_response({
        "policy": {"name": state.policy.name, "parameters": state.policy.describe()},
        "concurrency_source": str(view.source),
        "live_concurrency": {
            "total": view.load(), "spec": view.load("spec"), "base": view.load("base"),
        },
        "profile": None if profile is None else {
            "source": state.profile_source, "created": profile.created,
            "age_seconds": profile.age_seconds(),
            "loaded_seconds_ago": time.time() - state.profile_loaded_at,
            "crossover": profile.raw.get("crossover"),
            "note": profile.crossover.note,
        },
        "backends": [
            {"name": b.name, "url": b.url, "pool": b.pool, "healthy": b.healthy,
             "breaker": b.breaker.describe(),
             "inflight": b.inflight, "running": v.running, "queued": v.queued,
             "accept_length": v.accept_length,
             "accept_length_age_seconds": v.accept_length_age}
            for b, v in zip(state.backends, view.backends, strict=True)
        ],
        "recent_decisions": list(state.recent),
        "draining": state.draining,
    })  # fmt: skip


async def _swap_profile(request: web.Request) -> web.Response:
    """Route by the posted profile from the next request on; none in flight is dropped.

    The crossover comes from the profile even when one was given at start."""
    state = request.app[STATE]
    try:
        profile = parse_profile(await request.json())
        params = {k: v for k, v in state.settings.policy_params().items() if k != "crossover"}
        policy = build_policy(state.policy.name, params, profile)
    except ValueError as exc:  # bad JSON, ProfileError and PolicyError alike
        return error_response(400, f"The profile was not loaded: {exc}")
    state.adopt(policy, profile, "POST /router/profile")
    return web.json_response(
        {"policy": {"name": policy.name, "parameters": policy.describe()},
         "profile": {"created": profile.created, "crossover": profile.raw["crossover"]}}
    )  # fmt: skip
