"""Forward one request to the backend a policy chose, relaying the answer as it arrives.

Bodies go upstream byte for byte (SGLang's extra fields survive); answers come back chunk
by chunk with their status and content type. A connection error or a 503 before any byte
reached the client is retried once on the other pool; a stream that breaks later ends with
an SSE error event, never a silent truncation. The in-flight count goes up at dispatch and
down in one ``finally``, whatever happens.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
from aiohttp import web

from specroute.policies.decision import Decision
from specroute.policies.view import POOLS, Pool, RequestInfo
from specroute.router.backend import Backend
from specroute.router.errors import error_response, sse_error
from specroute.router.state import RouterState

_FORWARDED_HEADERS = ("Content-Type", "Accept", "User-Agent")  # never the client's key


def _forwarded(request: web.Request) -> dict[str, str]:
    return {k: request.headers[k] for k in _FORWARDED_HEADERS if k in request.headers}


class Retry(Exception):
    """The upstream failed before any byte was relayed; another backend may serve."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def request_info(path: str, body: dict[str, Any]) -> RequestInfo:
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    params = body.get("sampling_params")
    if max_tokens is None and isinstance(params, dict):
        max_tokens = params.get("max_new_tokens")
    return RequestInfo(
        path=path,
        stream=bool(body.get("stream", False)),
        max_tokens=max_tokens if isinstance(max_tokens, int) else None,
    )


async def proxy(request: web.Request, state: RouterState) -> web.StreamResponse:
    if state.draining:
        return error_response(503, "The router is shutting down.", "service_unavailable")
    if request.content_type != "application/json":
        return error_response(
            400, f"Content-Type must be application/json, got {request.content_type!r}."
        )
    raw = await request.read()
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return error_response(400, f"The request body is not valid JSON: {exc}")
    if not isinstance(body, dict):
        return error_response(400, "The request body must be a JSON object.")
    info = request_info(request.path, body)
    view = state.view()
    decision = state.policy.choose(info, view)
    state.record(decision, view.load())
    tried: set[str] = set()
    while decision.backend is not None:
        backend = state.backend(decision.backend)
        tried.add(backend.name)
        try:
            return await _forward(request, state, backend, raw, body)
        except Retry as exc:
            state.metrics.upstream_errors.labels(backend=backend.name, kind=exc.kind).inc()
            decision = _retry_decision(state, decision.pool, tried)
            if decision.backend is None:
                return error_response(502, f"The backend failed: {exc}", "upstream_error")
            state.record(decision, state.view().load())
    return error_response(503, "No healthy backend can serve this request.", "service_unavailable")


def _retry_decision(state: RouterState, failed: Pool, tried: set[str]) -> Decision:
    """Once, on the other pool (or another backend of the same pool if the other has none)."""
    if len(tried) > 1:
        return Decision(failed, None, "retry")
    view = state.view()
    other: Pool = POOLS[1] if failed == POOLS[0] else POOLS[0]
    for pool in (other, failed):
        candidates = [b for b in view.healthy(pool) if b.name not in tried]
        if candidates:
            best = min(candidates, key=lambda b: b.load(view.source))
            return Decision(pool, best.name, "retry")
    return Decision(failed, None, "retry")


async def _forward(
    request: web.Request, state: RouterState, backend: Backend, raw: bytes, body: dict[str, Any]
) -> web.StreamResponse:
    assert state.session is not None  # set at startup, before any request is served
    m, pool = state.metrics, backend.pool
    settings = state.settings
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=settings.connect_timeout, sock_read=settings.idle_timeout
    )
    started = time.monotonic()
    backend.inflight += 1
    m.inflight.labels(pool=pool, backend=backend.name).set(backend.inflight)
    status = "error"
    response: web.StreamResponse | None = None
    try:
        try:
            upstream = await state.session.post(
                backend.url + request.path, data=raw, headers=_forwarded(request),
                timeout=timeout, auto_decompress=False,
            )  # fmt: skip
        except (aiohttp.ClientConnectionError, TimeoutError) as exc:
            raise Retry("connect", f"{backend.name}: {exc!r}") from None
        async with upstream:
            if upstream.status == 503:
                await upstream.read()
                raise Retry("unavailable", f"{backend.name} answered 503")
            response = web.StreamResponse(status=upstream.status)
            for key in ("Content-Type", "Cache-Control"):
                if key in upstream.headers:
                    response.headers[key] = upstream.headers[key]
            response.headers["x-specroute-backend"] = backend.name
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            first = True
            state.upstreams.add(upstream)
            try:
                async for chunk in upstream.content.iter_any():
                    if first:
                        await response.prepare(request)
                        m.ttft.labels(pool=pool).observe(time.monotonic() - started)
                        first = False
                    await response.write(chunk)
            except (aiohttp.ClientError, TimeoutError) as exc:
                if state.draining:  # the drain timeout closed the upstream
                    status = "cut_off"
                    message = "The router is shutting down; its drain timeout cut this off."
                else:
                    m.upstream_errors.labels(backend=backend.name, kind="midstream").inc()
                    if first:
                        raise Retry("midstream", f"{backend.name}: {exc!r}") from None
                    status = "broken"
                    message = (
                        f"The backend {backend.name} failed mid-stream "
                        f"({type(exc).__name__}); the answer is incomplete."
                    )
                if first:
                    return error_response(503, message, "service_unavailable")
                if upstream.content_type != "text/event-stream":
                    status = "truncated"  # a truncated JSON body must not look complete
                    if request.transport is not None:
                        request.transport.close()
                    return response
                await response.write(sse_error(message))
            finally:
                state.upstreams.discard(upstream)
            if first:
                await response.prepare(request)
            await response.write_eof()
            status = str(upstream.status) if status == "error" else status
            return response
    except asyncio.CancelledError:
        status = "cancelled"
        _abort_upstream(state, backend, body)
        raise
    finally:
        backend.inflight -= 1
        m.inflight.labels(pool=pool, backend=backend.name).set(backend.inflight)
        if status != "error":
            m.requests.labels(pool=pool, backend=backend.name, status=status).inc()
            m.duration.labels(pool=pool).observe(time.monotonic() - started)


def _abort_upstream(state: RouterState, backend: Backend, body: dict[str, Any]) -> None:
    """Closing the connection makes SGLang abort; a known ``rid`` is also aborted by name."""
    rid = body.get("rid")
    if isinstance(rid, str) and rid and state.session is not None:
        session = state.session

        async def abort() -> None:
            try:
                async with session.post(f"{backend.url}/abort_request", json={"rid": rid}) as r:
                    await r.read()
            except (aiohttp.ClientError, TimeoutError):
                state.metrics.upstream_errors.labels(backend=backend.name, kind="abort").inc()

        task = asyncio.get_running_loop().create_task(abort())
        state.background.add(task)
        task.add_done_callback(state.background.discard)
