"""A trace played as a closed loop whose number of clients changes at phase boundaries:
client ``k`` sends back to back while the phase's concurrency is above ``k`` and idles
otherwise (a request it started before the phase changed runs to its end)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp

from bench.client import send
from bench.record import RequestRecord
from bench.trace import Trace

_IDLE_POLL = 0.02


async def play(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Iterator[dict[str, Any]],
    trace: Trace,
    label: str,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> tuple[float, list[RequestRecord]]:
    """Returns when the last phase ends (requests still running are cancelled) with the
    start time and every request; a record's ``level`` is its phase's concurrency and
    ``repeat`` the phase's index."""
    started = time.monotonic()
    records: list[RequestRecord] = []

    async def client(k: int) -> None:
        while (phase := trace.phase_at(time.monotonic() - started)) is not None:
            level = trace.phases[phase].concurrency
            if k >= level:
                await asyncio.sleep(_IDLE_POLL)
                continue
            record = RequestRecord(label, level, phase, time.monotonic(), measured=True)
            records.append(record)
            await send(session, url, next(bodies), record)
            if on_record is not None:
                on_record(record)
            if record.error is not None:
                await asyncio.sleep(_IDLE_POLL)  # a failing backend must not spin the loop

    tasks = [asyncio.create_task(client(k)) for k in range(trace.peak)]
    await asyncio.sleep(trace.seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for record in records:
        if record.end is None and record.error is None:
            record.error = "cancelled: the trace ended"
    return started, records
