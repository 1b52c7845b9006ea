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

A capacity test asks for less and cannot wait as long: with ``ramp="at-once"`` every client
starts at once and the window opens when each has its first token (a staggered start of
thousands of clients would outlast the measurement), and with ``cut_off`` the window ends
``duration`` seconds after it opened, cutting off what is in flight; its rates then come
from the chunks' times, not from whole requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import aiohttp

from specroute.loadgen.client import send
from specroute.loadgen.record import RequestRecord, tokens_between
from specroute.server_metrics import BackendStats, parse, window_accept_length

CANCELLED = "cancelled: the measurement window ended"
WARMUP_REQUESTS = 1  # per client, after the staggered start has spread their phases
_GIVE_UP_AFTER = 3  # consecutive failures per client before the level stops

Ramp = Literal["staggered", "at-once"]


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
            "backend": self.backend,
            "level": self.level,
            "repeat": self.repeat,
            "t0": self.t0,
            "t1": self.t1,
            "window_seconds": self.t1 - self.t0,
            "measured": len(self.measured),
            "sent": len(self.records),
            "failures": self.failures,
            "valid": self.valid,
            "output_tps": self.output_tps(),
            "accept_length": self.accept_length,
            "counters": self.stats,
        }


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

    def finished(self, worker: int, record: RequestRecord, warming: bool) -> None:
        if warming and record.error is None and self.t0 is None:
            self.finished_by[worker] = self.finished_by.get(worker, 0) + 1
            warm = [n for n in self.finished_by.values() if n >= WARMUP_REQUESTS]
            if len(warm) == self.level:
                self.open()
        self.pending.discard(id(record))
        if self.closed() and not self.pending:
            self.stop()

    def open(self) -> None:
        if self.t0 is None:
            self.t0 = time.monotonic()
            self.opened.set()

    def stop(self) -> None:
        if self.t1 is None:
            self.t1 = time.monotonic()
        self.done.set()


@dataclass
class _Level:
    """One level's clients and the watcher of its window, and what they gathered."""

    session: aiohttp.ClientSession
    url: str
    bodies: Iterator[dict[str, Any]]
    backend: str
    repeat: int
    loop: _Loop
    staggered: bool  # each client starts once the one before has its first token
    headers: dict[str, str] | None
    on_record: Callable[[RequestRecord], None] | None
    records: list[RequestRecord] = field(default_factory=list)
    scrapes: dict[str, BackendStats | None] = field(default_factory=dict)
    watched: bool = False  # the window opened and at_window was awaited at its start
    first_token: list[asyncio.Event] = field(init=False)  # by client

    def __post_init__(self) -> None:
        self.first_token = [asyncio.Event() for _ in range(self.loop.level)]

    async def client(self, worker: int) -> None:
        loop, level = self.loop, self.loop.level
        if self.staggered and worker > 0:
            await self.first_token[worker - 1].wait()
        ramped: asyncio.Event | None = self.first_token[worker]
        failures = 0
        while not loop.done.is_set():
            measured = loop.measure_next()
            record = RequestRecord(
                self.backend, level, self.repeat, time.monotonic(), measured=measured
            )
            self.records.append(record)
            if measured:
                loop.pending.add(id(record))
            await send(self.session, self.url, next(self.bodies), record, self.headers, ramped)
            ramped = None
            if self.on_record is not None:
                self.on_record(record)
            failures = failures + 1 if record.error else 0
            if failures >= _GIVE_UP_AFTER:
                loop.stop()
            loop.finished(worker, record, warming=self.staggered)

    async def window(
        self, at_window: Callable[[], Awaitable[None]] | None, cut_off: float | None
    ) -> None:
        """Reads the counters as the window opens; ``cut_off``: closes it that many seconds
        after it opened."""
        loop = self.loop
        if not self.staggered:
            await asyncio.gather(*(e.wait() for e in self.first_token))
            loop.open()
        await loop.opened.wait()
        self.scrapes["before"] = await _scrape(self.session, self.url)
        if at_window is not None:
            await at_window()
        self.watched = True
        if cut_off is not None:
            assert loop.t0 is not None
            await asyncio.sleep(loop.t0 + cut_off - time.monotonic())
            loop.stop()

    def result(self) -> LevelRun:
        """The level once its clients stopped: what still ran is marked cancelled."""
        for record in self.records:
            if record.end is None and record.error is None:
                record.error = CANCELLED
        loop = self.loop
        assert loop.t1 is not None
        t0 = loop.t0 if loop.t0 is not None else loop.t1
        before, after = self.scrapes.get("before"), self.scrapes["after"]
        accept = None if before is None or after is None else window_accept_length(before, after)
        stats = {name: asdict(snap) for name, snap in self.scrapes.items() if snap is not None}
        return LevelRun(
            self.backend, loop.level, self.repeat, t0, loop.t1, self.records, accept, stats
        )


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
    ramp: Ramp = "staggered",
    cut_off: bool = False,
    at_window: Callable[[], Awaitable[None]] | None = None,
) -> LevelRun:
    """One level; see the module's docstring. ``at_window`` is awaited as the window opens
    and again as it closes, after the backend's counters are read and while the load is
    still on: for what else the caller reads over the same window (the second call is
    skipped when the first did not happen)."""
    if (requests is None) == (duration is None):
        raise ValueError("give exactly one of requests and duration")
    if cut_off and duration is None:
        raise ValueError("cut_off needs a duration")
    loop = _Loop(level, requests, duration)
    staggered = ramp == "staggered"
    run = _Level(session, url, bodies, backend, repeat, loop, staggered, headers, on_record)
    tasks = [asyncio.create_task(run.client(i)) for i in range(level)]
    watcher = asyncio.create_task(run.window(at_window, duration if cut_off else None))
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(loop.done.wait(), give_up_after)
    loop.stop()
    run.scrapes["after"] = await _scrape(session, url)
    if at_window is not None and run.watched:
        await at_window()
    for task in (*tasks, watcher):
        task.cancel()
    await asyncio.gather(*tasks, watcher, return_exceptions=True)
    return run.result()
