"""Step 1 of a request: *choose*. Read from the body what the policy needs, ask it at the
load now (or, for a request that goes on from a stored response, take that response's
server), and record the decision in the request's record for every request's listeners;
a request refused before it is decided (shutting down, rate-limited, a body that cannot be
read, no room) is answered here."""

from __future__ import annotations

import functools
import json
from typing import Any

import orjson
from aiohttp import web

from specroute.policies.decision import Decision
from specroute.policies.view import POOLS, Pool, RequestInfo, Tokens
from specroute.router.admission.limits import Refusal, at_capacity, refused
from specroute.router.backends.backend import Backend
from specroute.router.observability.record import RequestRecord
from specroute.router.protocol.asked import Proxied
from specroute.router.protocol.errors import error_response
from specroute.router.protocol.request_id import with_rid
from specroute.router.proxy.proxying import Choosing
from specroute.router.proxy.request import request_info
from specroute.router.proxy.stored_responses import PATH as RESPONSES_PATH
from specroute.router.proxy.stored_responses import owner

STORED = "stored"  # a decision's reason: the server that holds what the request goes on from


async def choose(
    request: Proxied, choosing: Choosing, record: RequestRecord
) -> tuple[bytes, dict[str, Any], Decision, Tokens] | web.Response:
    """The body as it came and as read, the policy's decision, recorded, and the request's
    estimated tokens (its prompt's, its context's) for the backend's counts; or a refusal. A
    decision holds one of admission's slots, which the caller gives back."""
    if choosing.draining():
        return error_response(503, "The router is shutting down.", "service_unavailable")
    span = record.span
    limited = None if choosing.rate_limit is None else choosing.rate_limit.refusal(request)
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
        found = await _stored(choosing, body["previous_response_id"])
        if isinstance(found, web.Response):
            return found
        stored = found
    info = request_info(request.path, body, choosing.prefix_bytes)
    decide = functools.partial(_decide, choosing, info, record, stored)
    admitted = await choosing.admission.admit(decide)
    if isinstance(admitted, Refusal):
        if span is not None:
            span.refused(admitted)
        return refused(admitted)
    if request.path == "/generate" and "rid" not in body:
        rid, sent = record.request_id, choosing.rids
        if rid not in sent:  # SGLang refuses a rid already in flight: one client's id twice
            raw, body = with_rid(raw, rid), {**body, "rid": rid}
            sent.add(rid)
            record.rid_sent = True
    return raw, body, admitted, info.tokens(choosing.in_force.tokens_per_byte)


async def _stored(choosing: Choosing, previous: Any) -> Backend | web.Response | None:
    """The server that holds the stored response a Responses API request goes on from
    (``previous_response_id``), which alone can serve it; None for none named."""
    if previous is None:
        return None
    if not isinstance(previous, str) or not previous:
        return error_response(
            400, "previous_response_id must be a response's id.", param="previous_response_id"
        )
    return await owner(choosing.stored, previous, "previous_response_id")


def _decide(
    choosing: Choosing,
    info: RequestInfo,
    record: RequestRecord,
    stored: Backend | None = None,
) -> Decision | None:
    """The policy's decision at the load now, recorded; None, not recorded, when the request
    must wait for room at the pool chosen (``queue_at_capacity``). It may be made in another
    request's task, as that one leaves: ``record`` is this request's. A request that goes
    on from a stored response goes to its server (``STORED``)."""
    view = choosing.view()
    if stored is not None:
        decision = Decision(stored.pool, stored.name, STORED)
    else:
        decision = choosing.place(choosing.in_force.policy.choose(info, view), info, view)
    if choosing.queue_at_capacity and at_capacity(view, decision):
        return None
    decided(choosing, record, decision, view.load())
    return decision


def decided(choosing: Choosing, record: RequestRecord, decision: Decision, load: int) -> None:
    """The decision in the request's record, told to every request's listeners."""
    record.decided(decision, load, choosing.in_force.policy.name)
    choosing.lifecycle.decided(record)


def _parsed(raw: bytes) -> Any:
    """The body read by orjson, several times faster than ``json``; what orjson refuses and
    ``json`` reads (NaN, integers past 64 bits, lone surrogates) is read by ``json``, so
    that the router accepts the same bodies a Python server does."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError:
        return json.loads(raw)


def retry_decision(choosing: Choosing, failed: Pool, tried: set[str]) -> Decision:
    """Once, on the other pool (or another backend of the same pool if the other has none)."""
    if len(tried) > 1:
        return Decision(failed, None, "retry")
    view = choosing.view()
    other: Pool = POOLS[1] if failed == POOLS[0] else POOLS[0]
    for pool in (other, failed):
        candidates = [b for b in view.healthy(pool) if b.name not in tried]
        if candidates:
            best = min(candidates, key=lambda b: b.load(view.source))
            return Decision(pool, best.name, "retry")
    return Decision(failed, None, "retry")
