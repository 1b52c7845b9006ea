"""A router on a loopback port in front of emulators, inside the test's event loop."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from specroute.router.app import STATE, create_app
from specroute.router.runner import RouterRunner
from specroute.router.settings import RouterSettings
from specroute.router.state import RouterState
from tests.apps import serving


@asynccontextmanager
async def running_router(**settings: Any) -> AsyncIterator[tuple[str, RouterState]]:
    app = create_app(RouterSettings(**settings))
    async with serving(app, RouterRunner) as url:
        yield url, app[STATE]
