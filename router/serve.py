"""Run the router until interrupted, on uvloop where it is installed."""

from __future__ import annotations

import contextlib

from aiohttp import web

from router.app import create_app
from router.settings import RouterSettings


def run(settings: RouterSettings) -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()
    app = create_app(settings)
    banner = (
        f"specroute router on http://{settings.host}:{settings.port}: "
        f"spec {', '.join(settings.spec)}; base {', '.join(settings.base)}"
    )
    web.run_app(
        app,
        host=settings.host,
        port=settings.port,
        handler_cancellation=True,
        access_log=None,
        shutdown_timeout=settings.drain_timeout,
        print=lambda _: print(banner, flush=True),
    )
