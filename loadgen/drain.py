"""Servers rid of the requests a run cancelled: each one's ``GET /v1/loads`` (SGLang's, the
emulator's) read until nothing runs or waits there, so that the next run starts on idle
servers as soon as they are, with no pause of fixed length."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import aiohttp

from specroute.server_metrics import BackendStats, parse_loads

EVERY = 0.05  # seconds between reads: a cancelled stream leaves at its server's next step


async def loads(session: aiohttp.ClientSession, url: str) -> BackendStats | None:
    """What ``url``'s ``/v1/loads`` says now (``parse_loads``); None where it cannot say (no
    ``/v1/loads``, as vLLM, or no answer of that shape)."""
    try:
        async with session.get(f"{url}/v1/loads") as r:
            return parse_loads(await r.json(content_type=None)) if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None


async def busy(session: aiohttp.ClientSession, url: str) -> float | None:
    """The requests running and waiting at ``url`` now; None where it cannot say."""
    stats = await loads(session, url)
    if stats is None or stats.running is None or stats.queued is None:
        return None
    return stats.running + stats.queued


async def drained(
    session: aiohttp.ClientSession, urls: Sequence[str], seconds: float
) -> bool | None:
    """Whether nothing runs or waits at any of ``urls`` within ``seconds`` (True as soon as
    so); None where one of them cannot say."""
    deadline = time.monotonic() + seconds
    while True:
        counts = [await busy(session, url) for url in urls]
        if None in counts:
            return None
        if not any(counts):
            return True
        if time.monotonic() >= deadline:
            return False
        await asyncio.sleep(EVERY)
