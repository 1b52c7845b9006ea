"""An aiohttp application, or a handler of raw sockets, on a free loopback port, inside the
test's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from aiohttp import web


@asynccontextmanager
async def serving(
    app: web.Application,
    runner_class: type[web.AppRunner] = web.AppRunner,
    port: int = 0,
    host: str = "127.0.0.1",
) -> AsyncIterator[str]:
    """Serve ``app`` until the block ends; yields its base URL. A client that goes away
    cancels its handler, as in the router and the emulator when they run for real; the
    router's runner is ``runner_class``; ``port``: a free one (0), or one chosen before, for
    routers that name each other; ``host``: another loopback address (127.0.0.2) for
    routers on the same port, as pods behind one name are."""
    runner = runner_class(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    try:
        yield f"http://{host}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@asynccontextmanager
async def listening(
    handle: Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]],
) -> AsyncIterator[str]:
    """``handle`` serving each connection on a raw socket until the block ends; yields the
    base URL (a backend scripted byte by byte)."""
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
