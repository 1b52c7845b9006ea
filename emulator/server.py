"""The emulated SGLang server: ``create_app(config)`` wires the engine loop to HTTP."""

from __future__ import annotations

import asyncio
import gzip
import hmac
import logging
import re
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from specroute.background import cancel_and_wait
from specroute.emulator import step_trace
from specroute.emulator.accept_schedule import AcceptChange, apply, retake
from specroute.emulator.acceptance import AcceptanceError
from specroute.emulator.cache_flush import CacheFlush, timeout_of
from specroute.emulator.config import VERSION, EmulatorConfig
from specroute.emulator.engine import Emission, Sequence
from specroute.emulator.errors import BadRequest, error_body, error_response, read_json
from specroute.emulator.fault_injector import FaultInjector
from specroute.emulator.faults import Fault, FaultError, parse_change
from specroute.emulator.gpus import SharedGpus
from specroute.emulator.loop import EngineLoop
from specroute.emulator.metrics import EngineMetrics
from specroute.emulator.native_api import NativeHandlers
from specroute.emulator.openai_api import OpenAIHandlers
from specroute.emulator.responses_api import ResponsesHandlers
from specroute.event_loop import new_event_loop

LOOP = web.AppKey("loop", EngineLoop)
CONFIG = web.AppKey("config", EmulatorConfig)
STARTED = web.AppKey("started", float)
FAULTS = web.AppKey("faults", FaultInjector)
FLUSH = web.AppKey("flush", CacheFlush)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def _errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BadRequest as exc:
        return error_response(exc)
    except UnicodeEncodeError as exc:  # a lone surrogate that JSON lets through: "\ud800"
        return error_response(BadRequest(f"A string in the request is not valid Unicode: {exc}"))
    except web.HTTPException as exc:
        if exc.status >= 400:
            return web.json_response({"detail": exc.reason}, status=exc.status)
        raise
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as exc:  # an emulator bug must still answer in SGLang's shape
        body = error_body(f"Internal server error: {exc!r}", 500, "InternalServerError")
        return web.json_response(body, status=500)


_OPEN_PREFIXES = ("/health", "/ready", "/metrics")
_CREATED = re.compile(r"(# (HELP|TYPE) )?[a-zA-Z_:][a-zA-Z0-9_:]*_created[{ ]")


def _api_key(key: str) -> Middleware:
    """SGLang's check: a bearer key on everything but probes, compared in constant time."""

    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.method == "OPTIONS" or request.path.startswith(_OPEN_PREFIXES):
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.encode(), key.encode()):
            return await handler(request)
        return web.json_response({"error": "Unauthorized"}, status=401)

    return check


def create_app(config: EmulatorConfig) -> web.Application:
    if (refusal := config.adaptive_refusal()) is not None:  # as SGLang warns, and goes on
        logging.getLogger("sglang.srt.arg_groups.speculative_hook").warning(
            "speculative_adaptive disabled: %s. Falling back to static speculative params.",
            refusal,
        )
    metrics = EngineMetrics(config.model_path)
    loop = EngineLoop(
        config.engine(),
        metrics,
        time_scale=config.time_scale,
        max_queued_requests=config.max_queued_requests,
        decode_log_interval=config.decode_log_interval,
        stream_interval=config.stream_interval,
        gpus=None if config.share_gpus is None else SharedGpus(config.share_gpus),
    )
    faults = FaultInjector(metrics.faults, config.faults, config.seed)
    # a dead server refuses before it could check a key
    middlewares: list[Middleware] = [_errors, faults.middleware()]
    if config.api_key is not None:
        middlewares.append(_api_key(config.api_key))
    # SGLang's server (FastAPI on uvicorn) reads a body of any size: aiohttp's 1 MiB cap
    # would answer 413 where SGLang answers (a prompt too long for the context is its 400)
    app = web.Application(middlewares=middlewares, client_max_size=sys.maxsize)
    app[LOOP] = loop
    app[CONFIG] = config
    app[STARTED] = time.time()
    app[FAULTS] = faults
    _pace(app)
    openai = OpenAIHandlers(loop, config.context_length, faults, config.enable_cache_report)
    native = NativeHandlers(loop, config.context_length, faults)
    app.router.add_post("/v1/chat/completions", openai.chat)
    app.router.add_post("/v1/completions", openai.completions)
    responses = ResponsesHandlers(
        loop, config.context_length, faults, config.model_path, config.enable_response_store
    )
    app.router.add_post("/v1/responses", responses.create)
    app.router.add_get("/v1/responses/{response_id}", responses.retrieve)
    app.router.add_post("/v1/responses/{response_id}/cancel", responses.cancel)
    app.router.add_post("/generate", native.generate)
    app.router.add_put("/generate", native.generate)
    app.router.add_post("/abort_request", native.abort_request)
    app.router.add_get("/v1/models", _models)
    app.router.add_get("/v1/models/{model:.+}", _model)
    for path in ("/health", "/health_generate"):
        app.router.add_get(path, _health)
    app.router.add_get("/ready", _ready)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, _server_info)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, _model_info)
    app.router.add_get("/v1/loads", _loads)
    app[FLUSH] = CacheFlush(loop)
    for method in ("GET", "POST"):
        app.router.add_route(method, "/flush_cache", _flush_cache)
        app.router.add_route(method, "/start_profile", _start_profile)
        app.router.add_route(method, "/stop_profile", _stop_profile)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/emulator/acceptance", _get_acceptance)
    app.router.add_post("/emulator/acceptance", _set_acceptance)
    app.router.add_get("/emulator/faults", _get_faults)
    app.router.add_post("/emulator/faults", _set_faults)
    app.router.add_delete("/emulator/faults", _set_faults)
    app.cleanup_ctx.append(_run_engine)
    return app


async def _run_engine(app: web.Application) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(app[LOOP].run(), name="engine-loop")]
    if schedule := app[CONFIG].accept_schedule:
        tasks.append(asyncio.create_task(_follow_schedule(app, schedule), name="accept-schedule"))
    yield
    await cancel_and_wait(tasks)
    if (gpus := app[LOOP].gpus) is not None:
        gpus.close()


async def _follow_schedule(app: web.Application, schedule: tuple[AcceptChange, ...]) -> None:
    """Each change at its emulated time since the engine started: wall time over the scale."""
    loop, engine_loop = asyncio.get_running_loop(), app[LOOP]
    started = loop.time()
    for change in schedule:
        await asyncio.sleep(max(0.0, started + change.at * engine_loop.time_scale - loop.time()))
        apply(engine_loop.engine, change)


def _model_card(config: EmulatorConfig) -> dict[str, Any]:
    return {
        "id": config.model_path,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "sglang",
        "root": config.model_path,
        "parent": None,
        "max_model_len": config.context_length,
    }


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [_model_card(request.app[CONFIG])]})


async def _model(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    name = request.match_info["model"]
    if name != config.model_path:
        error = {
            "message": f"The model '{name}' does not exist",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        return web.json_response({"error": error}, status=404)
    return web.json_response(_model_card(config))


async def _health(request: web.Request) -> web.Response:
    """Like SGLang's default: healthy once the engine produces output within the timeout."""
    loop, config = request.app[LOOP], request.app[CONFIG]
    if not loop.engine.idle:
        ok = await loop.wait_progress(config.health_timeout)
        return web.Response(status=200 if ok else 503)
    done: asyncio.Queue[Emission] = asyncio.Queue()
    seq = Sequence(f"HEALTH_CHECK_{uuid.uuid4().hex}", "", 1, 1, ignore_eos=True)
    loop.submit(seq, done.put_nowait)
    try:
        await asyncio.wait_for(done.get(), config.health_timeout)
    except TimeoutError:
        return web.Response(status=503)
    finally:
        loop.release(seq.rid)
    return web.Response(status=200)


async def _ready(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _server_info(request: web.Request) -> web.Response:
    loop, config = request.app[LOOP], request.app[CONFIG]
    state: dict[str, Any] = {
        "last_gen_throughput": loop.last_gen_throughput,
        "effective_max_running_requests_per_dp": config.effective_max_running,
        "memory_usage": {"weight": 0.0, "kvcache": 0.0, "token_capacity": loop.max_total_tokens},
    }
    if loop.avg_spec_accept_length is not None:
        state["avg_spec_accept_length"] = loop.avg_spec_accept_length
    info = config.server_args() | {
        "status": "ready",
        "max_total_num_tokens": loop.max_total_tokens,
        "max_req_input_len": config.context_length - 1,
        "startup_time": request.app[STARTED],
        "internal_states": [state],
        "version": VERSION,
        "emulator": {
            "hardware": config.hardware.name,
            "time_scale": config.time_scale,
            "acceptance": loop.engine.acceptance.describe(),
            "faults": request.app[FAULTS].describe()["faults"],
            "noise": config.noise.describe(),
        },
    }
    return web.json_response(info)


async def _model_info(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    return web.json_response(
        {
            "model_path": config.model_path,
            "tokenizer_path": config.model_path,
            "is_generation": True,
            "served_model_name": config.model_path,
            "weight_version": "default",
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": str(config.hardware.raw.get("model_type", "")),
        }
    )


async def _flush_cache(request: web.Request) -> web.Response:
    flushed, said = await request.app[FLUSH].flush(timeout_of(request.query.get("timeout")))
    return web.Response(text=said, status=200 if flushed else 400)


async def _start_profile(request: web.Request) -> web.Response:
    asked = await read_json(request) if await request.read() else None
    if request.app[LOOP].trace.start(asked):
        return web.Response(text=step_trace.STARTED)
    return web.Response(text="Internal Server Error", status=500)  # SGLang's RuntimeError


async def _stop_profile(request: web.Request) -> web.Response:
    if request.app[LOOP].trace.stop():
        return web.Response(text=step_trace.STOPPED)
    return web.Response(text="Internal Server Error", status=500)


async def _loads(request: web.Request) -> web.Response:
    loop, config = request.app[LOOP], request.app[CONFIG]
    engine = loop.engine
    used = sum(s.context_tokens for s in engine.running)
    load: dict[str, Any] = {
        "timestamp": time.time(),
        "dp_rank": 0,
        "num_running_reqs": len(engine.running),
        "num_waiting_reqs": len(engine.waiting),
        "num_used_tokens": used,
        "max_total_num_tokens": loop.max_total_tokens,
        "max_running_requests": config.effective_max_running,
        "token_usage": used / loop.max_total_tokens,
        "gen_throughput": loop.last_gen_throughput,
    }
    if loop.avg_spec_accept_length is not None:
        length = loop.avg_spec_accept_length
        load["speculative"] = {"accept_length": length, "accept_rate": (length - 1) / engine.steps}
    return web.json_response(
        {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "version": VERSION,
            "accelerator": None,
            "num_accelerators": 0,
            "loads": [load],
        }
    )


async def _metrics(request: web.Request) -> web.Response:
    """SGLang's multiprocess collector exports no ``_created`` samples, so neither do we;
    and like SGLang's (prometheus_client's ASGI app) the text is gzipped for a client that
    accepts gzip."""
    text = generate_latest(request.app[LOOP].metrics.registry).decode()
    kept = [line for line in text.splitlines() if not _CREATED.match(line)]
    body = ("\n".join(kept) + "\n").encode()
    headers = {"Content-Type": CONTENT_TYPE_LATEST}
    if "gzip" in request.headers.get("Accept-Encoding", ""):
        body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
    return web.Response(body=body, headers=headers)


async def _get_acceptance(request: web.Request) -> web.Response:
    return web.json_response(request.app[LOOP].engine.acceptance.describe())


async def _set_acceptance(request: web.Request) -> web.Response:
    """Change acceptance while serving: new requests take the new rates at once."""
    engine = request.app[LOOP].engine
    try:
        engine.acceptance = engine.acceptance.updated(await read_json(request))
    except AcceptanceError as exc:
        raise BadRequest(str(exc)) from None
    retake(engine)
    return web.json_response(engine.acceptance.describe())


async def _get_faults(request: web.Request) -> web.Response:
    return web.json_response(request.app[FAULTS].describe())


async def _set_faults(request: web.Request) -> web.Response:
    """Replace the faults while serving (``DELETE``, or an empty list, clears them); the
    requests already streaming keep the faults drawn for them."""
    faults: tuple[Fault, ...] = ()
    seed = None
    if request.method == "POST":
        try:
            faults, seed = parse_change(await read_json(request))
        except FaultError as exc:
            raise BadRequest(str(exc)) from None
    request.app[FAULTS].set(faults, seed)
    _pace(request.app)
    return web.json_response(request.app[FAULTS].describe())


def _pace(app: web.Application) -> None:
    """The fault ``slow`` makes every step take its factor times longer, from the next."""
    app[LOOP].time_scale = app[CONFIG].time_scale * app[FAULTS].slowdown


def serve(config: EmulatorConfig) -> None:
    """Serve until interrupted, on uvloop where it is installed."""
    speculation = (
        f"EAGLE3, {config.acceptance.steps} steps, accept length "
        f"{config.acceptance.describe()['accept_length']:.2f}"
        if config.speculative
        else "no speculation"
    )
    if config.adaptive:
        speculation += ", adaptive depth"

    banner = (
        f"specroute emulator: {config.hardware.name} ({speculation}), time scale "
        f"{config.time_scale:g}, on http://{config.host}:{config.port}"
    )
    web.run_app(
        create_app(config),
        host=config.host,
        port=config.port,
        handler_cancellation=True,
        access_log=None,
        print=lambda _: print(banner, flush=True),
        loop=new_event_loop(),
    )
