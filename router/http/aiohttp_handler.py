"""The handler of the proxied paths on aiohttp's server (a request the own front hands over):
the request read through aiohttp's objects, served by the proxy as the own front serves
one, and answered with the relay's response."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web

from specroute.router.observability.record import RECORD
from specroute.router.protocol.reply import AiohttpProxied
from specroute.router.proxy.handler import serve
from specroute.router.proxy.proxying import Proxying


def proxied(
    proxying: Proxying, write_seconds: float
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The handler of the proxied paths on aiohttp's server; an answer the client leaves
    unread for ``write_seconds`` is cut."""

    unread = proxying.attempting.metrics.client_limits.labels(limit="write_timeout").inc

    async def handler(request: web.Request) -> web.StreamResponse:
        asked = AiohttpProxied(request, write_seconds, unread)
        refusal = await serve(asked, proxying, request[RECORD])
        if refusal is not None:
            return refusal
        assert asked.answer.response is not None  # the relay began its answer
        return asked.answer.response

    return handler
