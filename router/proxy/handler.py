"""Forward one request to the backend a policy chose, relaying the answer as it arrives.

Three steps. *Choose*: read from the body what the policy needs, ask it, record its
decision. *Open*: send the body upstream byte for byte (SGLang's extra fields survive) and
wait for the first byte of the answer; nothing has reached the client yet, so a connection
error, a 503 or an answer that breaks now is retried once on the other pool. *Relay*:
committed; the answer goes back chunk by chunk with its status and content type, and a
backend that fails from here ends a stream with an SSE error event and a plain body with
a cut connection, never a silent truncation or a retry. Each backend's in-flight count
and estimated KV tokens go up at dispatch and down in one place whatever happens, and how
the request ended there is one ``Outcome``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from specroute.policies.decision import Decision
from specroute.policies.view import POOLS, Pool, RequestInfo
from specroute.router.admission.limits import Refusal, at_capacity, refused
from specroute.router.backends.backend import Backend
from specroute.router.backends.flight import Flight
from specroute.router.observability.access_log import Trail, trail_of
from specroute.router.observability.tracing import CURRENT, RequestSpan
from specroute.router.protocol.asked import Proxied
from specroute.router.protocol.errors import error_response
from specroute.router.protocol.outcome import Outcome
from specroute.router.protocol.reply import AiohttpProxied
from specroute.router.protocol.request_id import with_rid
from specroute.router.proxy.relay import ClientGone, relay
from specroute.router.proxy.request import request_info
from specroute.router.proxy.stored_responses import PATH as RESPONSES_PATH
from specroute.router.proxy.stored_responses import owner
from specroute.router.proxy.stream_usage import asked_for
from specroute.router.proxy.upstream_call import Failure, closed, open_upstream
from specroute.router.state import RouterState

PROXIED = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate")
STORED = "stored"  # a decision's reason: the server that holds what the request goes on from


def proxy(state: RouterState) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of the proxied paths on aiohttp's server."""

    seconds = state.settings.client_write_timeout
    unread = state.metrics.client_limits.labels(limit="write_timeout").inc

    async def handler(request: web.Request) -> web.StreamResponse:
        asked = AiohttpProxied(request, seconds, unread)
        refusal = await serve(asked, state)
        if refusal is not None:
            return refusal
        assert asked.answer.response is not None  # the relay began its answer
        return asked.answer.response

    return handler


async def serve(request: Proxied, state: RouterState) -> web.Response | None:
    """A proxied request served: a refusal not yet sent, or None, answered through its
    reply. Each coroutine between the server and the relay is stepped through again at
    every resumption (every chunk of a stream), so the request is served in as few as it
    can be: one more only when it is traced."""
    if (tracing := state.tracing) is None:
        return await _proxy(request, state)
    span = tracing.start(request)
    token = CURRENT.set(span)
    status: int | None = None
    try:
        refusal = await _proxy(request, state)
        status = request.reply().status if refusal is None else refusal.status
        return refusal
    finally:
        span.end(status)
        CURRENT.reset(token)


async def _proxy(request: Proxied, state: RouterState) -> web.Response | None:
    chosen = await _choose(request, state)
    if isinstance(chosen, web.Response):
        return chosen  # refused: shutting down, or a body the router cannot read
    raw, body, decision, context = chosen
    tried: set[str] = set()
    try:
        while decision.backend is not None:
            backend = state.roster.backend(decision.backend)
            tried.add(backend.name)
            try:
                return await _forward(request, state, backend, raw, body, context)
            except Failure as failure:  # nothing reached the client: once more, elsewhere
                if decision.reason == STORED:  # no other server holds what it goes on from
                    return _gave_up(failure)
                decision = _retry_decision(state, decision.pool, tried)
                if decision.backend is None:
                    return _gave_up(failure)
                _record(state, decision, state.view().load(), CURRENT.get(), trail_of())
        return error_response(
            503,
            "No healthy backend can serve this request.",
            "service_unavailable",
            retry_after=state.settings.health_interval,
        )
    finally:
        state.admission.release()


def _gave_up(failure: Failure) -> web.Response:
    """Every backend tried failed before its first byte: busy ones say when to come back."""
    if failure.outcome is Outcome.UNAVAILABLE:
        return error_response(
            503, f"Every backend tried is busy: {failure}", "service_unavailable", retry_after=1
        )
    return error_response(502, f"The backend failed: {failure}", "upstream_error")


# 1. Choose


async def _choose(
    request: Proxied, state: RouterState
) -> tuple[bytes, dict[str, Any], Decision, int] | web.Response:
    """The body as it came and as read, the policy's decision, recorded, and the request's
    estimated context (KV tokens) for the backend's count; or a refusal. A decision holds
    one of admission's slots, which the caller gives back."""
    if state.draining:
        return error_response(503, "The router is shutting down.", "service_unavailable")
    span = CURRENT.get()
    limited = None if state.rate_limit is None else state.rate_limit.refusal(request)
    if limited is not None:
        if span is not None:
            span.refused(Refusal.RATE_LIMITED)
        return limited
    if request.content_type != "application/json":
        return error_response(
            400, f"Content-Type must be application/json, got {request.content_type!r}."
        )
    raw = await request.read()
    try:
        body = _parsed(raw)
    except ValueError as exc:  # not JSON, not UTF-8, or an integer past Python's digit limit
        return error_response(400, f"The request body is not valid JSON: {exc}")
    except RecursionError:
        return error_response(400, "The request body nests too deeply to be read.")
    if not isinstance(body, dict):
        return error_response(400, "The request body must be a JSON object.")
    stored: Backend | None = None
    if request.path == RESPONSES_PATH and "previous_response_id" in body:
        found = await _stored(state, body["previous_response_id"])
        if isinstance(found, web.Response):
            return found
        stored = found
    info, trailed = request_info(request.path, body, state.placement.prefix_bytes), trail_of()
    decide = functools.partial(_decide, state, info, span, trailed, stored)
    admitted = await state.admission.admit(decide)
    if isinstance(admitted, Refusal):
        if span is not None:
            span.refused(admitted)
        return refused(admitted)
    if trailed is not None and request.path == "/generate" and "rid" not in body:
        rid, sent = trailed.request_id, state.rids
        if rid not in sent:  # SGLang refuses a rid already in flight: one client's id twice
            raw, body = with_rid(raw, rid), {**body, "rid": rid}
            sent.add(rid)
            trailed.rid_sent = True
    return raw, body, admitted, info.context(state.in_force.tokens_per_byte)


async def _stored(state: RouterState, previous: Any) -> Backend | web.Response | None:
    """The server that holds the stored response a Responses API request goes on from
    (``previous_response_id``), which alone can serve it; None for none named."""
    if previous is None:
        return None
    if not isinstance(previous, str) or not previous:
        return error_response(
            400, "previous_response_id must be a response's id.", param="previous_response_id"
        )
    return await owner(state, previous, "previous_response_id")


def _decide(
    state: RouterState,
    info: RequestInfo,
    span: RequestSpan | None,
    trailed: Trail | None,
    stored: Backend | None = None,
) -> Decision | None:
    """The policy's decision at the load now, recorded; None, not recorded, when the request
    must wait for room at the pool chosen (``queue_at_capacity``). It may be made in another
    request's task, as that one leaves: the span and trail are this request's. A request
    that goes on from a stored response goes to its server (``STORED``)."""
    view = state.view()
    if stored is not None:
        decision = Decision(stored.pool, stored.name, STORED)
    else:
        decision = state.place(state.in_force.policy.choose(info, view), info, view)
    if state.settings.queue_at_capacity and at_capacity(view, decision):
        return None
    _record(state, decision, view.load(), span, trailed)
    return decision


def _record(
    state: RouterState,
    decision: Decision,
    load: int,
    span: RequestSpan | None,
    trailed: Trail | None,
) -> None:
    """The decision counted and kept, and told to the request's access line and span."""
    state.decisions.record(decision, load)
    if span is not None:
        span.decided(decision, state.in_force.policy.name, load)
    if trailed is not None:
        trailed.decided(decision, load, state.in_force.policy.name)


def _parsed(raw: bytes) -> Any:
    """The body read by orjson, several times faster than ``json``; what orjson refuses and
    ``json`` reads (NaN, integers past 64 bits, lone surrogates) is read by ``json``, so
    that the router accepts the same bodies a Python server does."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


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


# 2 and 3, at one backend (upstream.py, relay.py), in flight all along


async def _forward(
    request: Proxied,
    state: RouterState,
    backend: Backend,
    raw: bytes,
    body: dict[str, Any],
    context: int,
) -> web.Response | None:
    """Open the upstream and relay its answer (None), or the refusal of a failure that
    cannot be retried; a retryable ``Failure`` propagates."""
    joined = state.online.joined(state.roster.backends, backend)  # before it joins
    lived = state.online.lived(state.roster.backends, backend)
    flight = Flight(state.metrics, backend, body.get("stream") is True, context, lived)
    if state.online.records and (sent := asked_for(request.path, raw, body)) is not None:
        raw, flight.usage_added = sent, True  # every stream a sample (``stream_usage``)
    trailed = trail_of()
    if trailed is not None:
        trailed.flew(flight)
    try:
        upstream, first = await open_upstream(request, state, flight, raw)
        try:
            await relay(request.reply(), state, flight, upstream, first)
            return None
        finally:
            closed(state, upstream)
    except Failure as failure:
        if failure.outcome.retryable:
            raise
        flight.outcome = failure.outcome
        return _refusal(failure)
    except ClientGone:
        _client_left(state, flight, body)
        return None
    except asyncio.CancelledError:
        _client_left(state, flight, body)  # the client went away while the backend worked
        raise
    except Exception:
        flight.outcome = Outcome.INTERNAL  # counted, then aiohttp answers 500 and logs it
        raise
    finally:
        flight.land()
        accept = backend.accept_length(state.settings.stale_after, time.monotonic())
        state.online.served(flight, joined, accept)
        if (span := CURRENT.get()) is not None:
            span.landed(flight.outcome, backend.name)


def _client_left(state: RouterState, flight: Flight, body: dict[str, Any]) -> None:
    """The client went away: before its answer was whole, the request is cancelled (and
    aborted at the backend); after, it was answered, whatever the backend's end of it."""
    if flight.delivered:
        flight.outcome = Outcome.ANSWERED
        state.verdicts.request_ended(flight.backend, Outcome.ANSWERED)
        return
    flight.outcome = Outcome.CANCELLED
    _abort_upstream(state, flight.backend, body)


def _refusal(failure: Failure) -> web.Response:
    """The answer to a request that failed before its first byte and cannot be retried."""
    if failure.outcome is Outcome.TIMEOUT:
        return error_response(504, str(failure), "timeout")
    if failure.outcome is Outcome.OUT_OF_FDS:
        return error_response(503, str(failure), "service_unavailable", retry_after=1)
    return error_response(503, str(failure), "service_unavailable")  # the drain cut it off


def _abort_upstream(state: RouterState, backend: Backend, body: dict[str, Any]) -> None:
    """Closing the connection makes the engine abort; on SGLang a known ``rid`` is also
    aborted by name."""
    rid = body.get("rid")
    if isinstance(rid, str) and rid and state.session is not None and backend.aborts_by_rid:
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
