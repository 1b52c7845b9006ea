"""A trace played live: in a concurrency phase client ``k`` sends back to back while the
phase's concurrency is above ``k`` and idles otherwise (a request it started before the
phase changed runs to its end); in a rate phase each request is sent at its arrival time,
whether or not the ones before have ended. Each request's body is the one its phase sends
next."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from specroute.loadgen.client import send
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.trace import Trace

TRACE_ENDED = "cancelled: the trace ended"  # what a request still running at the end says
IDLE_POLL = 0.02  # how often an idle client looks whether its phase wants it


async def play(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Callable[[int], dict[str, Any]],  # the next body for a phase
    trace: Trace,
    label: str,
    on_record: Callable[[RequestRecord], None] | None = None,
    seed: int = 0,
) -> tuple[float, list[RequestRecord]]:
    """Returns when the last phase ends (requests still running are cancelled) with the
    start time and every request; a record's ``level`` is its phase's concurrency and
    ``repeat`` the phase's index."""
    started = time.monotonic()
    records: list[RequestRecord] = []

    async def one(phase: int) -> RequestRecord:
        record = RequestRecord(
            label, trace.phases[phase].concurrency, phase, time.monotonic(), measured=True
        )
        records.append(record)
        await send(session, url, bodies(phase), record)
        if on_record is not None:
            on_record(record)
        return record

    async def client(k: int) -> None:
        while (phase := trace.phase_at(time.monotonic() - started)) is not None:
            if k >= trace.phases[phase].concurrency:
                await asyncio.sleep(IDLE_POLL)
            elif (await one(phase)).error is not None:
                await asyncio.sleep(IDLE_POLL)  # a failing backend must not spin the loop

    async def arrivals() -> None:
        for at in trace.arrivals(seed):
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            phase = trace.phase_at(at)
            assert phase is not None
            tasks.append(asyncio.create_task(one(phase)))

    tasks: list[asyncio.Task[Any]] = [asyncio.create_task(client(k)) for k in range(trace.peak)]
    tasks.append(asyncio.create_task(arrivals()))
    await asyncio.sleep(trace.seconds)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for record in records:
        if record.end is None and record.error is None:
            record.error = TRACE_ENDED
    return started, records
