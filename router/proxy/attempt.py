"""Steps 2 and 3 of a request, at one server: *open* the upstream and *relay* its answer
(``upstream_call``, ``relay``), in flight at the server all along (``Flight``); however
the attempt ends, it lands, and every request's listeners hear it."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
from aiohttp import web

from specroute.policies.view import Tokens
from specroute.router.backends.backend import Backend
from specroute.router.backends.flight import Flight
from specroute.router.observability.record import RequestRecord
from specroute.router.protocol.asked import Proxied
from specroute.router.protocol.errors import error_response
from specroute.router.protocol.outcome import Outcome
from specroute.router.proxy.proxying import Attempting
from specroute.router.proxy.relay import ClientGone, relay
from specroute.router.proxy.stream_usage import asked_for
from specroute.router.proxy.upstream_call import Failure, open_upstream
from specroute.router.proxy.whole_timing import asked_meta_info, meta_info_asked


async def attempt(
    request: Proxied,
    attempting: Attempting,
    record: RequestRecord,
    backend: Backend,
    raw: bytes,
    body: dict[str, Any],
    tokens: Tokens,
) -> web.Response | None:
    """Open the upstream and relay its answer (None), or the refusal of a failure that
    cannot be retried; a retryable ``Failure`` propagates. However it ends, the attempt
    lands and every request's listeners hear it."""
    backends, online = attempting.asking.roster.backends, attempting.online
    joined = online.joined(backends, backend)  # before it joins
    stream = body.get("stream") is True
    lived = online.lived(backends, backend)
    flight = Flight(
        attempting.metrics, backend, stream, tokens.context, lived, joined, tokens.prompt
    )
    # every stream a sample (``stream_usage``), and every whole chat an SGLang server
    # answers (``whole_timing``)
    if online.records:
        offered = backend.offers_spec_details
        if (asked := asked_for(request.path, raw, body, offered)) is not None:
            raw, flight.usage_added, flight.details_added = asked
        flight.reads_details = offered and stream
        if not stream and backend.gives_meta_info:
            if (whole := meta_info_asked(request.path, raw, body)) is not None:
                raw, flight.meta_added = whole, True
            flight.reads_meta = flight.meta_added or asked_meta_info(request.path, body)
            if flight.reads_meta:
                flight.decoding_from_dispatch()
    record.flew(flight)
    try:
        relaying = attempting.relaying
        upstream, first = await open_upstream(request, relaying, record, flight, raw)
        try:
            await relay(request.reply(), relaying, flight, upstream, first)
            return None
        finally:
            relaying.let_go(upstream)
    except Failure as failure:
        if failure.outcome.retryable:
            raise
        flight.outcome = failure.outcome
        return _refusal(failure)
    except ClientGone:
        _client_left(attempting, record, flight, body)
        return None
    except asyncio.CancelledError:
        _client_left(attempting, record, flight, body)  # the client left while the backend worked
        raise
    except Exception:
        flight.outcome = Outcome.INTERNAL  # counted, then aiohttp answers 500 and logs it
        raise
    finally:
        flight.land()
        attempting.lifecycle.landed(record, flight)


def _client_left(
    attempting: Attempting, record: RequestRecord, flight: Flight, body: dict[str, Any]
) -> None:
    """The client went away: before its answer was whole, the request is cancelled (and
    aborted at the backend); after, it was answered, whatever the backend's end of it."""
    if flight.delivered:
        flight.outcome = flight.verdict = Outcome.ANSWERED
        return
    flight.outcome = Outcome.CANCELLED
    _abort_upstream(attempting, record, flight.backend, body)


def _refusal(failure: Failure) -> web.Response:
    """The answer to a request that failed before its first byte and cannot be retried."""
    if failure.outcome is Outcome.TIMEOUT:
        return error_response(504, str(failure), "timeout")
    if failure.outcome is Outcome.OUT_OF_FDS:
        return error_response(503, str(failure), "service_unavailable", retry_after=1)
    return error_response(503, str(failure), "service_unavailable")  # the drain cut it off


def _abort_upstream(
    attempting: Attempting, record: RequestRecord, backend: Backend, body: dict[str, Any]
) -> None:
    """Closing the connection makes the engine abort; on SGLang a known ``rid`` is also
    aborted by name (a traced request's abort a child of its span)."""
    rid = body.get("rid")
    asking = attempting.asking
    if isinstance(rid, str) and rid and asking.session is not None and backend.aborts_by_rid:
        session = asking.session
        traced = {} if record.span is None else record.span.upstream_headers()

        async def abort() -> None:
            url, sent = f"{backend.url}/abort_request", {"rid": rid}
            try:
                async with session.post(url, json=sent, headers=traced) as r:
                    await r.read()
            except (aiohttp.ClientError, TimeoutError):
                asking.failed(backend, "abort")

        task = asyncio.get_running_loop().create_task(abort())
        attempting.background.add(task)
        task.add_done_callback(attempting.background.discard)
