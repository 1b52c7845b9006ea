"""What a request on the own front passes before and after the request path, as aiohttp's
middleware (``front``) does for aiohttp's server: its record (its id, and the listeners
told of its end: its access line among them), its headers
readable, its key, its body whole in time and within its size; and its answer, whatever
the request path returned."""

from __future__ import annotations

import asyncio
import logging

from aiohttp import web

from specroute.router.admission.auth import Keys
from specroute.router.http.checks import before_body, body_late
from specroute.router.http.exchange import BodyRefused, FrontRequest
from specroute.router.http.runner import parse_refusal
from specroute.router.observability.record import ended, opened
from specroute.router.proxy.handler import serve
from specroute.router.proxy.proxying import Proxying

LOG = logging.getLogger("specroute.router.http")


async def served(
    request: FrontRequest,
    proxying: Proxying,
    keys: Keys,
    body_seconds: float,
    request_id_headers: list[str],
) -> None:
    """The request answered, or its task cancelled when its client goes away; checked as
    aiohttp's middleware checks one (``router.http.middleware``), with the same keys, time
    for the body and request-id headers."""
    record = opened(request, request_id_headers)
    reply, status = request.answer, None
    reply.request_id = (record.header, record.request_id)
    try:
        refusal = before_body(request.readable, keys, request)
        if refusal is None:
            refusal = await _whole_body(request, body_seconds)
        if refusal is None:
            refusal = await serve(request, proxying, record)
        if refusal is not None:
            if not request.intact or refusal.keep_alive is False:
                reply.keep_alive = False  # its body is not read: the connection ends
            reply.whole(refusal)
        status = reply.status
    except ConnectionError:
        pass  # the client went away before its answer was written: no status was answered
    except Exception:  # the router's own failure, said as aiohttp's server says it
        LOG.exception("Error handling request")
        status = 500
        if reply.status is None:
            reply.keep_alive = False
            reply.whole(parse_refusal(500, None))
        else:
            reply.cut()
    finally:
        try:
            proxying.choosing.lifecycle.ended(record, request, status)
        finally:
            ended(record)


async def _whole_body(request: FrontRequest, seconds: float) -> web.Response | None:
    """The body whole within ``seconds`` of the key found good (no body is waited for from
    a stranger), and within its size."""
    try:
        if request.arrived:
            await request.read()
        else:
            request.wait_for_body()
            async with asyncio.timeout(seconds):
                await request.read()
    except TimeoutError:
        return body_late(seconds)
    except BodyRefused as exc:
        return exc.answer()
    return None
