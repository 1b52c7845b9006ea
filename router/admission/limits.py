"""Admission: how many requests the router serves at once, and which wait.

A request is admitted when a router-wide slot is free (``max_concurrent_requests``, none:
no limit) and, with ``queue_at_capacity``, when the pool the policy chose has a backend
running fewer requests than the capacity it reports (SGLang's ``max_running_requests``):
otherwise it waits in a bounded FIFO queue, refused with 429 when the queue is full and
with 503 past ``queue_timeout``, each with ``Retry-After``. The policy decides when the
request is admitted, at the load it then joins: a request that waited is routed as it
leaves the queue, not as it came.

Each worker keeps its own queue; the slots and the queue's size are the router's
(``Quota``). A slot freed here goes to this worker's queue at once; one freed by another
worker is seen at the next tick, as is a backend's capacity freed.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from aiohttp import web

from specroute.policies.decision import Decision
from specroute.policies.view import View
from specroute.router.admission.quota import Quota
from specroute.router.metrics import RouterMetrics
from specroute.router.protocol.errors import error_response

TICK = 0.01  # seconds between looks at the slots and capacities while requests wait
RETRY_AFTER = 1.0  # seconds, said to a client refused for the queue


class Refusal(StrEnum):
    """Why admission refused a request: the ``reason`` of its counter."""

    QUEUE_FULL = "queue_full"  # 429: as many wait as the queue holds
    QUEUE_TIMEOUT = "queue_timeout"  # 503: it waited queue_timeout and was not admitted
    RATE_LIMITED = "rate_limited"  # 429: its key sent more than its rate (rate_limit.py)
    DRAINING = "draining"  # 503: it waited when the router began to drain


Decide = Callable[[], Decision | None]  # the policy's decision now, or None: no room there


def at_capacity(view: View, decision: Decision) -> bool:
    """Every healthy backend of the chosen pool runs as many requests as it reports it can
    (a backend that reports no capacity has room)."""
    backends = view.healthy(decision.pool)
    return bool(backends) and all(
        b.max_running_requests is not None and b.load(view.source) >= b.max_running_requests
        for b in backends
    )


@dataclass
class _Waiter:
    decide: Decide
    admitted: asyncio.Future[Decision | None] = field(  # None: refused, the router drains
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


class Admission:
    def __init__(
        self, quota: Quota, metrics: RouterMetrics, queue_size: int, queue_timeout: float
    ) -> None:
        self.quota, self.metrics = quota, metrics
        self.queue_size, self.queue_timeout = queue_size, queue_timeout
        self._queue: deque[_Waiter] = deque()
        self._ticker: asyncio.Task[None] | None = None
        self._handed: _Waiter | None = None  # admitted from the queue, not yet dispatched
        for reason in Refusal:
            metrics.child(metrics.admission_refusals, reason)  # 0 from the start

    async def admit(self, decide: Decide) -> Decision | Refusal:
        """The decision the request is routed by once admitted (it holds a slot until
        ``release``), or why it was refused (it holds none)."""
        if self._handed is None and not self._waiting():  # none admitted and not yet counted
            decision = self._try(decide)
            if decision is not None:
                return decision
        if not self.quota.enqueue(self.queue_size):
            return self._refused(Refusal.QUEUE_FULL)
        waiter = _Waiter(decide)
        self._queue.append(waiter)
        self._tick()
        since = time.monotonic()
        try:
            async with asyncio.timeout(self.queue_timeout):
                decision = await waiter.admitted
        except TimeoutError:
            if not waiter.admitted.done() or waiter.admitted.cancelled():
                waiter.admitted.cancel()
                return self._refused(Refusal.QUEUE_TIMEOUT)
            decision = waiter.admitted.result()  # admitted just in time
        except asyncio.CancelledError:  # the client went away while it waited
            admitted = waiter.admitted
            if admitted.done() and not admitted.cancelled() and admitted.result() is not None:
                self.release()  # the slot it was given goes to the next
            waiter.admitted.cancel()
            raise
        finally:
            self.quota.dequeue()
            if self._handed is waiter:  # the next is looked at once this one is dispatched
                self._handed = None
                asyncio.get_running_loop().call_soon(self._pump)
            self.metrics.queue_wait.observe(time.monotonic() - since)
        return self._refused(Refusal.DRAINING) if decision is None else decision

    def release(self) -> None:
        """An admitted request ended: its slot goes to the next waiting, if any."""
        self.quota.give()
        self._pump()

    def shut(self) -> None:
        """The router drains: every request still waiting is refused."""
        while self._queue:
            waiter = self._queue.popleft()
            if not waiter.admitted.done():
                waiter.admitted.set_result(None)

    def _try(self, decide: Decide) -> Decision | None:
        if not self.quota.take():
            return None
        try:
            decision = decide()
        except BaseException:
            self.quota.give()
            raise
        if decision is None:
            self.quota.give()
        return decision

    def _pump(self) -> None:
        """Admit the first waiting request if it may go now. One at a time: the next is
        looked at once the one admitted has run to its dispatch (its task, woken, runs
        to the backend's count of it before its first wait), so that the load the next is
        decided at counts it."""
        if self._handed is not None or not self._waiting():
            return
        waiter = self._queue[0]
        try:
            decision = self._try(waiter.decide)
        except Exception as exc:  # the policy's fault: that request fails, not the queue
            self._queue.popleft()
            waiter.admitted.set_exception(exc)
            return
        if decision is None:
            return
        self._queue.popleft()
        waiter.admitted.set_result(decision)
        self._handed = waiter

    def _waiting(self) -> bool:
        """Whether any request waits (those that timed out or left are dropped first)."""
        while self._queue and self._queue[0].admitted.done():
            self._queue.popleft()
        return bool(self._queue)

    def _tick(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._ticker = asyncio.get_running_loop().create_task(self._ticking())

    async def _ticking(self) -> None:
        """While requests wait: slots another worker freed, capacity a backend freed."""
        while self._queue:
            await asyncio.sleep(TICK)
            self._pump()

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker

    def _refused(self, reason: Refusal) -> Refusal:
        m = self.metrics
        m.child(m.admission_refusals, reason).inc()
        return reason


def refused(reason: Refusal, retry_after: float = RETRY_AFTER) -> web.Response:
    """The OpenAI-shaped answer to a request admission refused."""
    if reason is Refusal.DRAINING:
        return error_response(503, "The router is shutting down.", "service_unavailable")
    if reason is Refusal.QUEUE_TIMEOUT:
        return error_response(
            503,
            "The router is at its limit of requests and this one waited its longest in the "
            "queue: try again later.",
            "service_unavailable",
            retry_after=retry_after,
        )
    if reason is Refusal.QUEUE_FULL:
        message = "The router is at its limit of requests and its queue is full."
    else:
        message = "This API key sent more requests than its rate limit allows."
    return error_response(429, message, "rate_limit_error", retry_after=retry_after)
