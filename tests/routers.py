"""A router on a loopback port in front of emulators, inside the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from specroute.router.app import create_app
from specroute.router.http.runner import RouterRunner
from specroute.router.http.server import site
from specroute.router.settings import RouterSettings
from specroute.router.state import STATE, RouterState


@asynccontextmanager
async def running_router(**given: Any) -> AsyncIterator[tuple[str, RouterState]]:
    """Served as ``specroute serve`` serves it: its front as the settings say (``front``,
    or SPECROUTE_FRONT for every test's router)."""
    settings = RouterSettings(**given)
    app = create_app(settings)
    runner = RouterRunner(app, handler_cancellation=True)
    await runner.setup()
    await site(runner, settings, "127.0.0.1", 0, False).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", app[STATE]
    finally:
        await runner.cleanup()
