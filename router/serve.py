"""Run the router until SIGTERM or SIGINT, then drain: ``/ready`` turns 503, new requests
are refused, and requests in flight get up to ``drain_timeout`` seconds to finish."""

from __future__ import annotations

import asyncio
import signal
import time

from aiohttp import web

from specroute.event_loop import run as run_loop
from specroute.router.app import STATE, create_app
from specroute.router.settings import RouterSettings
from specroute.router.state import RouterState

_DRAIN_POLL = 0.05
_CUT_OFF_GRACE = 1.0


def run(settings: RouterSettings) -> None:
    run_loop(serve(settings))


async def serve(settings: RouterSettings) -> None:
    app = create_app(settings)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=1)
    await runner.setup()
    try:
        site = web.TCPSite(runner, settings.host, settings.port)
        await site.start()
        print(
            f"specroute router on http://{settings.host}:{settings.port}: "
            f"spec {', '.join(settings.spec)}; base {', '.join(settings.base)}",
            flush=True,
        )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        stop.clear()
        await drain(app[STATE], settings.drain_timeout, stop)
    finally:
        await runner.cleanup()


async def drain(state: RouterState, seconds: float, again: asyncio.Event) -> None:
    """Refuse new work and wait for the in-flight count to reach 0, ``seconds``, or a
    second signal; then cut off what is left, each stream ending with an event saying why."""
    state.draining = True
    print(f"specroute router: draining {state.inflight()} request(s), up to {seconds:g} s",
          flush=True)  # fmt: skip
    await _until_idle(state, seconds, again)
    left = list(state.upstreams)
    for upstream in left:
        upstream.close()
    await _until_idle(state, _CUT_OFF_GRACE, again)
    print(f"specroute router: stopped, {len(left)} request(s) cut off", flush=True)


async def _until_idle(state: RouterState, seconds: float, again: asyncio.Event) -> None:
    deadline = time.monotonic() + seconds
    while state.inflight() and time.monotonic() < deadline and not again.is_set():  # noqa: ASYNC110
        await asyncio.sleep(_DRAIN_POLL)  # the count moves in every handler: polled, not signalled
