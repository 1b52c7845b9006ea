"""What the worker processes of one router share: one block of shared memory.

Each worker is a whole router, yet routing must see the deployment: its live concurrency,
and each backend's health and reported load. So the workers keep those here:

- each worker's count of requests in flight at each backend, in a slot of its own that
  only it writes; a reader sums a backend's slots. No lock on the hot path: a slot has one
  writer, and an aligned 8-byte store is never seen half done.
- what the leader (worker 0), which alone checks health and polls metrics, last learned of
  each backend: the health check's verdict with a sequence number (each worker feeds new
  verdicts to its own breaker), the running and queued requests it reports, its live accept
  length, and when these were read.
- each worker's breaker level of each backend, so that the gauges show the worst.
- how many profiles each worker was posted (``POST /router/profile``): a worker that sees
  the total grow reads the profile posted last from the workers' folder.

One worker (the default) uses the same layout with one row, in private memory. The block
is anonymous shared memory, made before the workers are forked and inherited by them.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

_INTS = 2  # per worker and backend: in flight, breaker level
_PUBLISHED_INTS = 2  # per backend: health-check sequence number, its verdict
_OWN_INTS = 1  # per worker: profiles it was posted
_FLOATS = 5  # per backend: running, queued, accept length, its time, the scrape's time
_NONE = math.nan


@dataclass(frozen=True)
class Reading:
    """The leader's last reading of a backend's ``/metrics``; ``None`` where not reported
    (or not a count: NaN or infinity from a broken exporter)."""

    running: int | None
    queued: int | None
    accept_length: float | None
    accept_length_at: float  # monotonic time of the window the accept length is from
    at: float  # monotonic time of the scrape (the clock is the machine's, not the process's)


class Board:
    def __init__(self, workers: int, backends: int, worker: int = 0) -> None:
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} is not one of {workers}")
        self.workers, self.backends, self.worker = workers, backends, worker
        cells = workers * backends
        ints = (_INTS * cells + _PUBLISHED_INTS * backends + _OWN_INTS * workers) * 8
        self._memory = mmap.mmap(-1, ints + _FLOATS * backends * 8)  # MAP_SHARED
        every = memoryview(self._memory)
        whole = every[:ints].cast("q")
        self._inflight = whole[:cells]
        self._levels = whole[cells : 2 * cells]
        self._health_seq = whole[2 * cells : 2 * cells + backends]
        self._health_ok = whole[2 * cells + backends : 2 * cells + 2 * backends]
        self._posted = whole[2 * cells + 2 * backends :]
        self._floats = every[ints:].cast("d")
        for i in range(_FLOATS * backends):
            self._floats[i] = _NONE
        self._row = worker * backends
        self._last: list[Reading | None] = [None] * backends  # what ``reading`` last made

    def become(self, worker: int) -> None:
        """In a forked worker: write from now on in the slots of ``worker``."""
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} is not one of {self.workers}")
        self.worker, self._row = worker, worker * self.backends

    @property
    def leader(self) -> bool:
        return self.worker == 0

    # in flight: own slots written, every worker's read

    def inflight(self, backend: int) -> int:
        """Requests in flight at ``backend`` through every worker."""
        return sum(self._inflight[backend :: self.backends])

    def own_inflight(self, backend: int) -> int:
        return self._inflight[self._row + backend]

    def add_inflight(self, backend: int, n: int) -> None:
        self._inflight[self._row + backend] += n

    def forget(self, worker: int) -> None:
        """A worker died: its requests died with it, so its slots are cleared for the one
        that takes its place."""
        start = worker * self.backends
        for i in range(start, start + self.backends):
            self._inflight[i] = self._levels[i] = 0

    # breaker levels, for the gauges

    def show_level(self, backend: int, level: int) -> None:
        self._levels[self._row + backend] = level

    def worst_level(self, backend: int) -> int:
        return max(self._levels[backend :: self.backends])

    # profiles posted to any worker (the profile itself is a file in the workers' folder)

    def post_profile(self) -> None:
        self._posted[self.worker] += 1

    def profiles_posted(self) -> int:
        """Profiles posted to every worker so far: a count that only grows, summed from
        slots that each have one writer, so that no post is lost to another's."""
        return sum(self._posted)

    # the leader's health verdicts and readings

    def publish_verdict(self, backend: int, ok: bool) -> None:
        self._health_ok[backend] = int(ok)
        self._health_seq[backend] += 1  # after the verdict: a reader that sees it sees both

    def verdict(self, backend: int) -> tuple[int, bool]:
        """The latest verdict's sequence number (0: none yet) and the verdict."""
        return self._health_seq[backend], bool(self._health_ok[backend])

    def publish_reading(
        self,
        backend: int,
        running: float | None,
        queued: float | None,
        accept: tuple[float, float] | None,
        at: float,
    ) -> None:
        """What the leader read: counts, the live accept length and its time, the time."""
        f, i = self._floats, backend * _FLOATS
        f[i] = _or_none(running)
        f[i + 1] = _or_none(queued)
        f[i + 2], f[i + 3] = accept if accept is not None else (_NONE, 0.0)
        f[i + 4] = at  # last: a reading is whole once its time is there

    def reading(self, backend: int) -> Reading | None:
        f, i = self._floats, backend * _FLOATS
        at = f[i + 4]
        if math.isnan(at):
            return None
        last = self._last[backend]
        if last is None or last.at != at:  # read at every request: made once a scrape
            last = Reading(_count(f[i]), _count(f[i + 1]), _value(f[i + 2]), f[i + 3], at)
            self._last[backend] = last
        return last


def _or_none(value: float | None) -> float:
    return _NONE if value is None else value


def _value(stored: float) -> float | None:
    return None if math.isnan(stored) else stored


def _count(stored: float) -> int | None:
    return int(stored) if math.isfinite(stored) else None
