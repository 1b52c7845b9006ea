"""What the proxy's calls upstream use of the router, and nothing else of it: the pooled
connections to the servers (set at startup), the timeouts of a stream and of a whole
answer, the counters, and the answers being relayed, each with its attempt.

The answers being relayed are what the drain cuts off when its time is up, and what the
watchdog of silent streams looks at: a stream whose backend has sent nothing for
``idle_timeout`` while the relay waited for it is ended, as its answer's own silence limit
ends it before its first byte (the relay then says so to the client and counts the
backend's ``timeout``). One look at every stream a tick, only while a stream is relayed:
an idle router never wakes for it."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from specroute.router.backends.flight import Flight
from specroute.router.metrics import RouterMetrics
from specroute.router.upstream.answer import Answer
from specroute.router.upstream.pool import Limits, UpstreamPool


class Relaying:
    def __init__(self, metrics: RouterMetrics, timeouts: tuple[Limits, Limits], idle: float):
        """``timeouts``: a stream's and a whole answer's; ``idle``: the longest silence
        within a stream."""
        self.metrics, self.timeouts, self.idle = metrics, timeouts, idle
        self.pool: UpstreamPool | None = None  # the requests' connections, from startup
        self.answers: dict[Answer, Flight] = {}  # being relayed
        self.watchdog: asyncio.Task[None] | None = None  # while a stream is relayed
        self.cut_off = False  # the drain's time ran out: what was left was closed
        # (backend, reason): answers whose meta_info could not be used, logged once each
        self.unread_logged: set[tuple[str, str]] = set()

    def hold(self, answer: Answer, flight: Flight) -> None:
        """``answer`` is relayed from here: the drain may cut it off, and a stream is
        watched for silence."""
        self.answers[answer] = flight
        if flight.stream and (self.watchdog is None or self.watchdog.done()):
            self.watchdog = asyncio.get_running_loop().create_task(self._watching())

    def let_go(self, answer: Answer) -> None:
        """The answer let go: its connection back to the pool if it was read to its end."""
        self.answers.pop(answer, None)
        answer.release()

    def cut(self) -> int:
        """The drain's time is up: every answer still relayed closed (each stream ends with
        an event saying why); how many."""
        self.cut_off = True
        left = list(self.answers)
        for answer in left:
            answer.close()
        return len(left)

    async def _watching(self) -> None:
        idle = self.idle
        tick = min(1.0, idle / 4)
        while any(flight.stream for flight in self.answers.values()):
            await asyncio.sleep(tick)
            now = time.monotonic()
            for upstream, flight in list(self.answers.items()):
                if not flight.stream:
                    continue  # a whole answer has its deadline
                received = upstream.received
                if received != flight.received or not flight.reading:
                    flight.received, flight.quiet_since = received, now
                elif now - flight.quiet_since > idle:
                    silent = aiohttp.ServerTimeoutError(f"no data for {idle:g} s")
                    upstream.fail(silent)
