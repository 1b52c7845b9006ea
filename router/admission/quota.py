"""What admission shares among the worker processes of one router, made before they fork.

- the router-wide slots of ``max_concurrent_requests``: a semaphore that every worker takes
  from without blocking, so that the limit holds across them exactly;
- each worker's count of requests holding a slot and of requests waiting in its queue, in
  shared memory (one writer a slot, as on the board): the gauges sum them, and a worker
  that died gives its slots back through them;
- each API key's token bucket (``rate_limit``): its tokens and when they were counted,
  read and written under a lock held for a few arithmetic steps.

One worker uses the same parts in its own memory.
"""

from __future__ import annotations

import math
import mmap
import multiprocessing
import time

_LOCK_SECONDS = 0.05  # far longer than a few stores take: past it, a worker died holding it


class Quota:
    def __init__(self, workers: int, limit: int | None, buckets: int) -> None:
        """``limit``: the router-wide slots, none for no limit; ``buckets``: the token
        buckets of the rate limit, one a key."""
        context = multiprocessing.get_context("fork")
        self.workers, self.limit, self.worker = workers, limit, 0
        self._slots = None if limit is None else context.BoundedSemaphore(limit)
        self._lock = context.Lock()
        self._memory = mmap.mmap(-1, (2 * workers + 2 * buckets) * 8)  # MAP_SHARED
        every = memoryview(self._memory)
        ints = every[: 2 * workers * 8].cast("q")
        self._admitted, self._queued = ints[:workers], ints[workers:]
        floats = every[2 * workers * 8 :].cast("d")
        self._tokens, self._counted = floats[:buckets], floats[buckets:]
        for i in range(buckets):
            self._counted[i] = math.nan  # never counted: a full bucket

    def become(self, worker: int) -> None:
        """In a forked worker: count from now on in the slots of ``worker``."""
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} is not one of {self.workers}")
        self.worker = worker

    # the router-wide slots

    def take(self) -> bool:
        """One slot for a request, if one is free (never waits)."""
        if self._slots is not None and not self._slots.acquire(block=False):
            return False
        self._admitted[self.worker] += 1
        return True

    def give(self) -> None:
        """The slot of a request that ended."""
        self._admitted[self.worker] -= 1
        if self._slots is not None:
            self._slots.release()

    def admitted(self) -> int:
        """Requests holding a slot, through every worker."""
        return sum(self._admitted)

    def forget(self, worker: int) -> None:
        """A worker died: the slots its requests held come back, its queue is gone."""
        held, self._admitted[worker], self._queued[worker] = self._admitted[worker], 0, 0
        if self._slots is None:
            return
        for _ in range(held):
            try:
                self._slots.release()
            except ValueError:  # it died between giving a slot back and counting it
                return

    # the queues

    def enqueue(self, size: int) -> bool:
        """One more waiting, if fewer than ``size`` wait through every worker."""
        if not self._lock.acquire(timeout=_LOCK_SECONDS):
            return False  # fail closed: refused, not admitted past the queue's size
        try:
            if sum(self._queued) >= size:
                return False
            self._queued[self.worker] += 1
            return True
        finally:
            self._lock.release()

    def dequeue(self) -> None:
        self._queued[self.worker] -= 1

    def queued(self) -> int:
        """Requests waiting for admission, through every worker."""
        return sum(self._queued)

    # the rate limit's token buckets

    def spend(self, bucket: int, rate: float, burst: int, now: float | None = None) -> float:
        """Take a token from ``bucket`` (refilled at ``rate`` a second, up to ``burst``):
        0 when one was there, otherwise the seconds until one will be (none taken)."""
        now = time.monotonic() if now is None else now  # one clock for every process
        if not self._lock.acquire(timeout=_LOCK_SECONDS):
            return 1.0  # fail closed: a request not counted is not let through
        try:
            counted = self._counted[bucket]
            tokens = float(burst)
            if not math.isnan(counted):
                tokens = min(tokens, self._tokens[bucket] + max(0.0, now - counted) * rate)
            wait = 0.0 if tokens >= 1 else (1 - tokens) / rate
            self._tokens[bucket] = tokens - 1 if wait == 0 else tokens
            self._counted[bucket] = now
            return wait
        finally:
            self._lock.release()
