"""Forward one request to the backend a policy chose, relaying the answer as it arrives.

Three steps. *Choose*: read from the body what the policy needs, ask it, record its
decision. *Open*: send the body upstream byte for byte (SGLang's extra fields survive) and
wait for the first byte of the answer; nothing has reached the client yet, so a connection
error, a 503 or an answer that breaks now is retried once on the other pool. *Relay*:
committed; the answer goes back chunk by chunk with its status and content type, and a
backend that fails from here ends a stream with an SSE error event and a plain body with
a cut connection, never a silent truncation or a retry. Each backend's in-flight count
goes up at dispatch and down in one place whatever happens, and how the request ended
there is one ``Outcome``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable
from typing import Any

import aiohttp
from aiohttp import web

from specroute.policies.decision import Decision
from specroute.policies.view import POOLS, Pool, RequestInfo
from specroute.router.backend import Backend
from specroute.router.errors import error_response, sse_error
from specroute.router.outcome import Outcome, out_of_fds
from specroute.router.settings import RouterSettings
from specroute.router.state import RouterState

_FORWARDED_HEADERS = ("Content-Type", "Accept", "User-Agent")  # never the client's key
_RELAYED_HEADERS = ("Content-Type", "Cache-Control", "Content-Encoding")
_MAX_HELD = 1 << 20  # bytes of one unfinished event the relay holds back at the most
_SHUTTING_DOWN = "The router is shutting down; its drain timeout cut this off."


class Failure(Exception):
    """The backend's answer failed, or the drain timeout cut it off: ``outcome`` says which."""

    def __init__(self, outcome: Outcome, message: str, cause: BaseException | None = None):
        super().__init__(message)
        self.outcome, self.cause = outcome, cause


async def proxy(request: web.Request, state: RouterState) -> web.StreamResponse:
    chosen = await _choose(request, state)
    if isinstance(chosen, web.Response):
        return chosen  # refused: shutting down, or a body the router cannot read
    raw, body, decision = chosen
    tried: set[str] = set()
    while decision.backend is not None:
        backend = state.backend(decision.backend)
        tried.add(backend.name)
        try:
            return await _forward(request, state, backend, raw, body)
        except Failure as failure:  # nothing reached the client: once more, elsewhere
            decision = _retry_decision(state, decision.pool, tried)
            if decision.backend is None:
                return _gave_up(failure)
            state.record(decision, state.view().load())
    return error_response(
        503, "No healthy backend can serve this request.", "service_unavailable",
        retry_after=state.settings.health_interval,
    )  # fmt: skip


def _gave_up(failure: Failure) -> web.Response:
    """Every backend tried failed before its first byte: busy ones say when to come back."""
    if failure.outcome is Outcome.UNAVAILABLE:
        return error_response(
            503, f"Every backend tried is busy: {failure}", "service_unavailable", retry_after=1
        )
    return error_response(502, f"The backend failed: {failure}", "upstream_error")


# 1. Choose


async def _choose(
    request: web.Request, state: RouterState
) -> tuple[bytes, dict[str, Any], Decision] | web.Response:
    """The body as it came and as read, and the policy's decision, recorded; or a refusal."""
    if state.draining:
        return error_response(503, "The router is shutting down.", "service_unavailable")
    if request.content_type != "application/json":
        return error_response(
            400, f"Content-Type must be application/json, got {request.content_type!r}."
        )
    raw = await request.read()
    try:
        body = json.loads(raw)
    except ValueError as exc:  # not JSON, not UTF-8, or an integer past Python's digit limit
        return error_response(400, f"The request body is not valid JSON: {exc}")
    except RecursionError:
        return error_response(400, "The request body nests too deeply to be read.")
    if not isinstance(body, dict):
        return error_response(400, "The request body must be a JSON object.")
    view = state.view()
    decision = state.policy.choose(request_info(request.path, body), view)
    state.record(decision, view.load())
    return raw, body, decision


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


# One backend: 2 and 3, in flight all along


class _Flight:
    """One request at one backend, from dispatch to the end of its answer: in flight all
    along, then counted once by its outcome. One the backend failed before its first byte
    is not counted here (the backend's error is, by kind): another may still serve it."""

    def __init__(self, state: RouterState, backend: Backend) -> None:
        self.state, self.backend = state, backend
        self.started = time.monotonic()
        self.outcome: Outcome | None = None
        self.status = 0  # the backend's HTTP status: the label of an answered request
        self._inflight = state.metrics.inflight.labels(pool=backend.pool, backend=backend.name)
        backend.inflight += 1
        self._inflight.set(backend.inflight)

    def first_byte(self) -> None:
        ttft = self.state.metrics.ttft.labels(pool=self.backend.pool)
        ttft.observe(time.monotonic() - self.started)

    def land(self) -> None:
        m, backend = self.state.metrics, self.backend
        backend.inflight -= 1
        self._inflight.set(backend.inflight)
        if self.outcome is not None:
            status = str(self.status) if self.outcome is Outcome.ANSWERED else self.outcome
            m.requests.labels(pool=backend.pool, backend=backend.name, status=status).inc()
            m.duration.labels(pool=backend.pool).observe(time.monotonic() - self.started)
            if self.outcome in (Outcome.OUT_OF_FDS, Outcome.INTERNAL):
                m.router_errors.labels(kind=self.outcome).inc()


async def _forward(
    request: web.Request, state: RouterState, backend: Backend, raw: bytes, body: dict[str, Any]
) -> web.StreamResponse:
    """Open the upstream and relay its answer; a retryable ``Failure`` propagates."""
    flight = _Flight(state, backend)
    stream = body.get("stream") is True
    try:
        async with _open(request, state, backend, raw, stream) as (upstream, first):
            return await _relay(request, flight, upstream, first)
    except Failure as failure:
        if failure.outcome.retryable:
            raise
        flight.outcome = failure.outcome
        return _refusal(failure)
    except _ClientGone as gone:
        flight.outcome = Outcome.CANCELLED
        _abort_upstream(state, backend, body)
        return gone.response
    except asyncio.CancelledError:
        flight.outcome = Outcome.CANCELLED  # the client went away while the backend worked
        _abort_upstream(state, backend, body)
        raise
    except Exception:
        flight.outcome = Outcome.INTERNAL  # counted, then aiohttp answers 500 and logs it
        raise
    finally:
        flight.land()


def _timeout(settings: RouterSettings, *, stream: bool) -> aiohttp.ClientTimeout:
    """A stream may run for hours as long as it keeps talking; a non-streamed answer comes
    whole at its end, so it gets a deadline instead of an idle limit."""
    if stream:
        return aiohttp.ClientTimeout(
            sock_connect=settings.connect_timeout, sock_read=settings.idle_timeout
        )
    return aiohttp.ClientTimeout(
        total=settings.request_timeout, sock_connect=settings.connect_timeout
    )


def _refusal(failure: Failure) -> web.Response:
    """The answer to a request that failed before its first byte and cannot be retried."""
    if failure.outcome is Outcome.TIMEOUT:
        return error_response(504, str(failure), "timeout")
    if failure.outcome is Outcome.OUT_OF_FDS:
        return error_response(503, str(failure), "service_unavailable", retry_after=1)
    return error_response(503, str(failure), "service_unavailable")  # the drain cut it off


# 2. Open: until the first byte, nothing reached the client


@contextlib.asynccontextmanager
async def _open(
    request: web.Request,
    state: RouterState,
    backend: Backend,
    raw: bytes,
    stream: bool,
) -> AsyncIterator[tuple[aiohttp.ClientResponse, bytes]]:
    """The backend's answer and its first chunk (empty if it has no body), or a Failure."""
    assert state.session is not None  # set at startup, before any request is served
    try:
        upstream = await state.session.post(
            backend.url + request.path, data=raw, headers=_forwarded(request, stream),
            timeout=_timeout(state.settings, stream=stream), auto_decompress=False,
        )  # fmt: skip
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise _unanswered(state, backend, exc) from None
    async with upstream:
        if upstream.status == 503:
            await upstream.read()
            raise _upstream_failed(state, backend, Outcome.UNAVAILABLE)
        state.upstreams.add(upstream)  # from here the drain timeout may close it
        try:
            try:
                first = await upstream.content.readany()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise _stopped(state, backend, exc) from None
            yield upstream, first
        finally:
            state.upstreams.discard(upstream)


def _forwarded(request: web.Request, stream: bool) -> dict[str, str]:
    """The client's headers that the backend needs. A whole body is relayed as it comes, so
    the backend may compress only what the client can read: the client's
    ``Accept-Encoding``, or none (aiohttp would otherwise offer gzip on its behalf). A
    stream is never compressed: the relay passes it event by event and may have to end it
    with an error event of its own."""
    headers = {k: request.headers[k] for k in _FORWARDED_HEADERS if k in request.headers}
    accepted = "identity" if stream else request.headers.get("Accept-Encoding", "identity")
    headers["Accept-Encoding"] = accepted
    return headers


def _unanswered(state: RouterState, backend: Backend, exc: BaseException) -> Failure:
    """No answer came: the router could not open a socket, the backend could not be reached
    or dropped the request, or answered what is not HTTP (nothing of it runs there:
    retryable), or it went silent."""
    if out_of_fds(exc):
        message = ("The router has run out of file descriptors (its open-files limit): "
                   "its own failure, not the backend's.")  # fmt: skip
        return Failure(Outcome.OUT_OF_FDS, message, exc)
    if isinstance(exc, TimeoutError) and not isinstance(exc, aiohttp.ConnectionTimeoutError):
        return _silent(state, backend, exc)
    if isinstance(exc, aiohttp.ClientConnectionError):
        return _upstream_failed(state, backend, Outcome.CONNECT, exc)
    return _upstream_failed(state, backend, Outcome.MIDSTREAM, exc)  # a malformed answer


def _silent(state: RouterState, backend: Backend, exc: BaseException) -> Failure:
    return _upstream_failed(
        state, backend, Outcome.TIMEOUT, exc,
        f"The backend {backend.name} did not answer in time; not retried, since it may still "
        "be working on this request.",
    )  # fmt: skip


def _upstream_failed(
    state: RouterState,
    backend: Backend,
    kind: Outcome,
    cause: BaseException | None = None,
    message: str | None = None,
) -> Failure:
    """The backend's failure, counted once, here, by its kind, and told to its breaker (a
    stream that then ends broken is not told twice)."""
    state.metrics.upstream_errors.labels(backend=backend.name, kind=kind).inc()
    state.request_ended(backend, kind)
    if message is None:
        # never the cause's repr: aiohttp's carries the request's headers, the backend key too
        said = "answered 503" if cause is None else f"{type(cause).__name__}: {cause}"
        message = f"{backend.name}: {said}"
    return Failure(kind, message, cause)


def _stopped(state: RouterState, backend: Backend, exc: BaseException) -> Failure:
    """The answer stopped: the drain timeout closed it, the backend went silent, or it
    failed."""
    if state.draining:
        return Failure(Outcome.CUT_OFF, _SHUTTING_DOWN)
    if isinstance(exc, TimeoutError):
        return _silent(state, backend, exc)
    return _upstream_failed(state, backend, Outcome.MIDSTREAM, exc)


# 3. Relay: committed, never retried


async def _relay(
    request: web.Request, flight: _Flight, upstream: aiohttp.ClientResponse, first: bytes
) -> web.StreamResponse:
    response = web.StreamResponse(status=upstream.status)
    for key in _RELAYED_HEADERS:
        if key in upstream.headers:
            response.headers[key] = upstream.headers[key]
    response.headers["x-specroute-backend"] = flight.backend.name
    if upstream.content_length is not None:
        response.content_length = upstream.content_length
    encoded = upstream.headers.get("Content-Encoding", "identity") != "identity"
    events = upstream.content_type == "text/event-stream" and not encoded
    chunk, held = first, b""  # held: the start of an event not yet whole
    try:
        await _to_client(response, response.prepare(request))
        if chunk:
            flight.first_byte()
        while chunk:
            if events:
                chunk, held = _whole_events(held + chunk)
                if len(held) > _MAX_HELD:  # no blank line for long: not events after all
                    chunk, held = chunk + held, b""
            if chunk:
                await _to_client(response, response.write(chunk))
            chunk = await upstream.content.readany()  # the backend's side
        if held:
            await _to_client(response, response.write(held))  # ended without a blank line
    except (aiohttp.ClientError, TimeoutError) as exc:  # the backend's: the client's are apart
        failure = _stopped(flight.state, flight.backend, exc)
        return await _end_early(request, flight, upstream, response, failure)
    await _to_client(response, response.write_eof())
    flight.outcome, flight.status = Outcome.ANSWERED, upstream.status
    flight.state.request_ended(flight.backend, Outcome.ANSWERED)
    return response


class _ClientGone(Exception):
    """Writing to the client failed: it went away. Not the backend's failure."""

    def __init__(self, response: web.StreamResponse) -> None:
        super().__init__("the client went away")
        self.response = response


async def _to_client(response: web.StreamResponse, writing: Awaitable[object]) -> None:
    try:
        await writing
    except ConnectionError as exc:  # aiohttp's ClientConnectionResetError is one
        raise _ClientGone(response) from exc


def _whole_events(data: bytes) -> tuple[bytes, bytes]:
    """``data`` cut after its last blank line: the events that are whole, and the rest. An
    event is relayed only when whole, so an error event never lands inside half of one."""
    lf, crlf = data.rfind(b"\n\n"), data.rfind(b"\r\n\r\n")
    end = max(lf + 2 if lf >= 0 else 0, crlf + 4 if crlf >= 0 else 0)
    return data[:end], data[end:]


async def _end_early(
    request: web.Request,
    flight: _Flight,
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    failure: Failure,
) -> web.StreamResponse:
    """A stream ends with an error event saying why; a plain body, cut short, with a cut
    connection, so that a truncated JSON body cannot look complete."""
    if upstream.content_type != "text/event-stream":
        flight.outcome = Outcome.TRUNCATED
        if request.transport is not None:
            request.transport.close()
        return response
    if failure.outcome is Outcome.CUT_OFF:
        flight.outcome, message = Outcome.CUT_OFF, str(failure)
    else:
        flight.outcome = Outcome.BROKEN
        message = (
            f"The backend {flight.backend.name} failed mid-stream "
            f"({type(failure.cause).__name__}); the answer is incomplete."
        )
    await _to_client(response, response.write(sse_error(message)))
    await _to_client(response, response.write_eof())
    return response


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
