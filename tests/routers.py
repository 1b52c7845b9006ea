"""A router on a loopback port in front of emulators, inside the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from aiohttp import web

from specroute.router.app import STATE, create_app
from specroute.router.settings import RouterSettings
from specroute.router.state import RouterState


@asynccontextmanager
async def running_router(**settings: Any) -> AsyncIterator[tuple[str, RouterState]]:
    app = create_app(RouterSettings(**settings))
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", app[STATE]
    finally:
        await runner.cleanup()
