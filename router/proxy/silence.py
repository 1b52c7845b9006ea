"""The watchdog of relayed streams: one whose backend has sent nothing for ``idle_timeout``
while the relay waited for it is ended, as its answer's own silence limit ends it before
its first byte (the relay then says so to the client and counts the backend's
``timeout``). One look at every stream a tick, only while a stream is relayed: an idle
router never wakes for it."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from specroute.router.state import RouterState


def watch(state: RouterState) -> None:
    """A stream is being relayed: the watchdog runs, if it does not already."""
    if state.silence is None or state.silence.done():
        state.silence = asyncio.get_running_loop().create_task(_watching(state))


async def _watching(state: RouterState) -> None:
    idle = state.settings.idle_timeout
    tick = min(1.0, idle / 4)
    while any(flight.stream for flight in state.upstreams.values()):
        await asyncio.sleep(tick)
        now = time.monotonic()
        for upstream, flight in list(state.upstreams.items()):
            if not flight.stream:
                continue  # a whole answer has its deadline
            received = upstream.received
            if received != flight.received or not flight.reading:
                flight.received, flight.quiet_since = received, now
            elif now - flight.quiet_since > idle:
                silent = aiohttp.ServerTimeoutError(f"no data for {idle:g} s")
                upstream.fail(silent)
