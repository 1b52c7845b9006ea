"""What every connection of one router's own front shares (``router.http.connection``): the
request path and the keys, the paths it serves, the limits aiohttp's server enforced, and
aiohttp's server itself for the requests it leaves to it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from specroute.router.admission.auth import Keys
from specroute.router.http.exchange import FrontRequest
from specroute.router.http.gate import served
from specroute.router.protocol.errors import error_response
from specroute.router.proxy.handler import PROXIED
from specroute.router.proxy.proxying import Proxying
from specroute.router.settings import RouterSettings

LIMITS = ("pipelined_requests", "pipelined_bytes", "write_timeout")


class Connection(Protocol):
    """One of the front's connections, as the router's stop sees it."""

    def close_idle(self) -> None: ...

    def cut(self) -> None: ...


class Front:
    """What every connection of one router's own front shares."""

    def __init__(
        self,
        settings: RouterSettings,
        proxying: Proxying,
        aiohttp: Callable[[], asyncio.Protocol],
    ) -> None:
        self.proxying, self.aiohttp = proxying, aiohttp
        self.keys = Keys(settings.admission.api_keys, settings.admin_key)
        self.body_seconds = settings.http.body_timeout
        self.request_id_headers = settings.observability.request_id_headers
        self.connections: set[Connection] = set()
        self.owned_paths = frozenset(path.encode() for path in PROXIED)
        self.owned_lines = tuple(b"POST %s HTTP/1.1\r" % path for path in self.owned_paths)
        self.owned_lines += tuple(line[:-1] + b"\n" for line in self.owned_lines)
        self.max_line = settings.http.max_header_bytes
        self.max_headers = settings.http.max_headers
        self.max_head = settings.http.max_header_bytes * (settings.http.max_headers + 2)
        self.max_body = settings.http.max_body_bytes
        self.idle_seconds = settings.http.client_idle_timeout
        self.write_seconds = settings.http.client_write_timeout
        self.max_ahead = settings.http.max_pipelined_requests
        self.max_ahead_bytes = settings.http.max_pipelined_bytes
        limits = proxying.attempting.metrics.client_limits
        self._limits = {limit: limits.labels(limit=limit) for limit in LIMITS}

    async def served(self, request: FrontRequest) -> None:
        await served(request, self.proxying, self.keys, self.body_seconds, self.request_id_headers)

    def limited(self, limit: str) -> None:
        """A connection held to one of ``LIMITS``."""
        self._limits[limit].inc()

    def too_large(self, size: int) -> web.Response:
        said = (
            "The request body is larger than the limit: Maximum request body size "
            f"{self.max_body} exceeded, actual body size {size}"
        )
        return error_response(413, said)
