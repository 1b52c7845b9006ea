"""The own front: the router's port served by its own HTTP/1.1 protocol
(``router.http.connection``) for the proxied paths, and by aiohttp's server for everything else,
on the same port and through the same runner: ``front = "own"``, the default; aiohttp's
server alone with ``"aiohttp"``.

aiohttp's server costs a request more CPU than all of the routing does (a ``web.Request``,
its ``StreamReader``, the application's dispatch and signals, a response object and its
writer): the own front parses with llhttp and writes an answer's bytes itself, and the
request path it runs is the one aiohttp's server runs (``proxy.serve``)."""

from __future__ import annotations

import asyncio
import time

from aiohttp import web

from specroute.router.http.connection import FrontConnection
from specroute.router.http.context import Front
from specroute.router.proxy.proxying import PROXYING
from specroute.router.settings import RouterSettings


class FrontSite(web.TCPSite):
    """A site of ``runner`` on the own front; its connections given to aiohttp are the
    runner's server's, closed by the runner as its own."""

    def __init__(
        self,
        runner: web.AppRunner,
        settings: RouterSettings,
        host: str,
        port: int,
        reuse_port: bool,
        drain: float,
    ) -> None:
        super().__init__(runner, host, port, reuse_port=reuse_port)
        self._front: Front | None = None
        self._settings, self._drain = settings, drain

    async def start(self) -> None:
        await web.BaseSite.start(self)  # registered with the runner, as TCPSite's start does
        runner, server = self._runner, self._runner.server
        assert isinstance(runner, web.AppRunner) and server is not None
        front = self._front = Front(self._settings, runner.app[PROXYING], server)
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: FrontConnection(front),
            self._host,
            self._port,
            backlog=self._backlog,
            reuse_port=self._reuse_port,
        )
        self._bound_port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """No new connection; idle ones closed; those answering get the runner's shutdown
        time to finish, then are cut."""
        await super().stop()
        if self._front is None:
            return
        connections = self._front.connections
        for connection in list(connections):
            connection.close_idle()
        deadline = time.monotonic() + self._drain
        while connections and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        for connection in list(connections):
            connection.cut()


DRAIN = 1.0  # seconds a connection still answering gets when the router stops


def site(
    runner: web.AppRunner, settings: RouterSettings, host: str, port: int, reuse_port: bool
) -> web.TCPSite:
    """The router's site: its own front's, or aiohttp's server's alone. ``runner`` is made
    with ``handler_cancellation`` and a ``shutdown_timeout`` of ``DRAIN``."""
    if settings.http.front == "own":
        return FrontSite(runner, settings, host, port, reuse_port, DRAIN)
    return web.TCPSite(runner, host, port, reuse_port=reuse_port)
