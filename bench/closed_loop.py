"""One concurrency level against one backend: a closed loop of ``level`` clients, each
sending its next request as soon as the last one ends.

Clients start one after another, each once the one before has its first token, so their
phases spread; until every client has finished ``WARMUP_REQUESTS`` requests the loop is
warming up. The measured requests are then the first ``requests`` to start, or those
starting within ``duration`` seconds; the loop keeps every client busy until the last of
them ends, so each runs at the full concurrency and slow requests are not cut from the
sample. Requests still running then are
cancelled (the server aborts them), not drained. Acceptance comes from the backend's
counters read at both ends of the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp

from specroute.bench.client import send
from specroute.bench.record import RequestRecord, tokens_between
from specroute.router.backend_stats import BackendStats, parse, window_accept_length

CANCELLED = "cancelled: the measurement window ended"
WARMUP_REQUESTS = 1  # per client, after the staggered start has spread their phases
_GIVE_UP_AFTER = 3  # consecutive failures per client before the level stops


@dataclass
class LevelRun:
    backend: str
    level: int
    repeat: int
    t0: float
    t1: float
    records: list[RequestRecord]
    accept_length: float | None
    stats: dict[str, dict[str, float | None]] = field(default_factory=dict)

    @property
    def measured(self) -> list[RequestRecord]:
        return [r for r in self.records if r.measured and r.ok]

    @property
    def failures(self) -> int:
        """Failed requests, measured or not; cancelling the unmeasured rest is no failure."""
        return sum(1 for r in self.records if r.error is not None and r.error != CANCELLED)

    @property
    def valid(self) -> bool:
        return self.failures == 0 and len(self.measured) > 0 and self.t1 > self.t0

    def output_tps(self) -> float:
        """Aggregate output tokens per second over the window, from every chunk in it."""
        tokens = tokens_between(self.records, self.t0, self.t1)
        return tokens / (self.t1 - self.t0) if self.t1 > self.t0 else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "level": self.level, "repeat": self.repeat,
            "t0": self.t0, "t1": self.t1, "window_seconds": self.t1 - self.t0,
            "measured": len(self.measured), "sent": len(self.records),
            "failures": self.failures, "valid": self.valid,
            "output_tps": self.output_tps(), "accept_length": self.accept_length,
            "counters": self.stats,
        }  # fmt: skip


async def _scrape(session: aiohttp.ClientSession, url: str) -> BackendStats | None:
    try:
        async with session.get(f"{url}/metrics") as r:
            return parse(await r.text()) if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


class _Loop:
    """The closed loop's bookkeeping: which requests are measured and when it is done."""

    def __init__(self, level: int, requests: int | None, duration: float | None) -> None:
        self.level, self.requests, self.duration = level, requests, duration
        self.finished_by: dict[int, int] = {}  # client: requests finished
        self.t0: float | None = None
        self.t1: float | None = None
        self.measured_started = 0
        self.pending: set[int] = set()  # ids of measured records still running
        self.opened, self.done = asyncio.Event(), asyncio.Event()

    def measure_next(self) -> bool:
        """Whether a request starting now is measured: after warm-up, the first ``requests``
        ones, or those starting within ``duration`` seconds."""
        if self.t0 is None:
            return False
        if self.requests is not None:
            if self.measured_started >= self.requests:
                return False
            self.measured_started += 1
            return True
        assert self.duration is not None
        return time.monotonic() < self.t0 + self.duration

    def closed(self) -> bool:
        if self.t0 is None:
            return False
        if self.requests is not None:
            return self.measured_started >= self.requests
        assert self.duration is not None
        return time.monotonic() >= self.t0 + self.duration

    def finished(self, worker: int, record: RequestRecord) -> None:
        if record.error is None and self.t0 is None:
            self.finished_by[worker] = self.finished_by.get(worker, 0) + 1
            warm = [n for n in self.finished_by.values() if n >= WARMUP_REQUESTS]
            if len(warm) == self.level:
                self.t0 = time.monotonic()
                self.opened.set()
        self.pending.discard(id(record))
        if self.closed() and not self.pending:
            self.stop()

    def stop(self) -> None:
        if self.t1 is None:
            self.t1 = time.monotonic()
        self.done.set()


async def run_level(
    session: aiohttp.ClientSession,
    url: str,
    bodies: Iterator[dict[str, Any]],
    *,
    backend: str,
    level: int,
    repeat: int,
    requests: int | None = None,
    duration: float | None = None,
    give_up_after: float = 600.0,
    headers: dict[str, str] | None = None,
    on_record: Callable[[RequestRecord], None] | None = None,
) -> LevelRun:
    if (requests is None) == (duration is None):
        raise ValueError("give exactly one of requests and duration")
    loop = _Loop(level, requests, duration)
    records: list[RequestRecord] = []
    scrapes: dict[str, BackendStats | None] = {}

    started = [asyncio.Event() for _ in range(level + 1)]
    started[0].set()

    async def client(worker: int) -> None:
        await started[worker].wait()
        ramp: asyncio.Event | None = started[worker + 1]
        failures = 0
        while not loop.done.is_set():
            measured = loop.measure_next()
            record = RequestRecord(backend, level, repeat, time.monotonic(), measured=measured)
            records.append(record)
            if measured:
                loop.pending.add(id(record))
            await send(session, url, next(bodies), record, headers, ramp)
            ramp = None
            if on_record is not None:
                on_record(record)
            failures = failures + 1 if record.error else 0
            if failures >= _GIVE_UP_AFTER:
                loop.stop()
            loop.finished(worker, record)

    async def scrape_at_start() -> None:
        await loop.opened.wait()
        scrapes["before"] = await _scrape(session, url)

    tasks = [asyncio.create_task(client(i)) for i in range(level)]
    watcher = asyncio.create_task(scrape_at_start())
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(loop.done.wait(), give_up_after)
    loop.stop()
    scrapes["after"] = await _scrape(session, url)
    for task in (*tasks, watcher):
        task.cancel()
    await asyncio.gather(*tasks, watcher, return_exceptions=True)
    for record in records:
        if record.end is None and record.error is None:
            record.error = CANCELLED
    assert loop.t1 is not None
    t0 = loop.t0 if loop.t0 is not None else loop.t1
    before, after = scrapes.get("before"), scrapes["after"]
    accept = None if before is None or after is None else window_accept_length(before, after)
    stats = {name: asdict(snap) for name, snap in scrapes.items() if snap is not None}
    return LevelRun(backend, level, repeat, t0, loop.t1, records, accept, stats)
