"""What the worker processes of one router share: one block of shared memory.

Each worker is a whole router, yet routing must see the deployment: its live concurrency,
and each backend's health and reported load. So the workers keep those here:

- each worker's count of requests in flight at each backend, and the sum of their
  estimated contexts (KV tokens), in slots of its own that only it writes; a reader sums
  a backend's slots. No lock on the hot path: a slot has one writer, and an aligned
  8-byte store is never seen half done. Beside each count, that count integrated over
  time up to its last change, and the change's time: a backend's load lived through, so
  that the mean load a request decoded under is two readings' difference over its time
  (online calibration's samples); a reader that meets another worker's slot mid-change is
  off by that change's last interval, no more. And the prompt tokens (estimated) it sent
  there so far, which only grows (a worker that dies leaves its part): the prefill a
  request decoded beside is two readings' difference too.
- the other routers' requests at each backend (several replicas in front of the same
  servers: the backend's reported running and queued less this router's own in flight at
  the reading, at least 0), held from one reading of the leader's to the next while it is
  believed (``stale_after``), and integrated over time likewise, so that a sample's load
  counts them as the policy does (``--concurrency-source replicas``); written by the
  leader alone, at each reading.
- what the leader (worker 0), which alone checks health and polls the backends, last
  learned of each: the health check's verdict with a sequence number (each worker feeds new
  verdicts to its own breaker), the running and queued requests and the capacity it
  reports, the router's own requests in flight there at that moment, its live accept
  length, and when these were read.
- each worker's breaker level of each backend, so that the gauges show the worst.
- how many profiles each worker was posted (``POST /router/profile``): a worker that sees
  the total grow reads the profile posted last from the workers' folder; and how many
  times the leader published the set of backends (discovery), likewise.
- online calibration's live crossover that the leader adopted (NaN: none), and how many
  times it published a fit (the fit itself is a file in the workers' folder).

Backends are columns: a fixed number, each given to one server at a time by the leader
(discovery adds and removes servers while the router runs; a column is given again only
once nothing is in flight there). One worker (the default) uses the same layout with one
row, in private memory. The block is anonymous shared memory, made before the workers are
forked and inherited by them.
"""

from __future__ import annotations

import itertools
import math
import mmap
import time
from dataclasses import dataclass

_INTS = 3  # per worker and backend: in flight, their KV tokens, breaker level
_PUBLISHED_INTS = 2  # per backend: health-check sequence number, its verdict
_OWN_INTS = 1  # per worker: profiles it was posted
_GLOBAL_INTS = 2  # times the leader published the set of backends, and an online fit
_OWN_FLOATS = 1  # per worker: its CPU seconds, as it last showed them
_GLOBAL_FLOATS = 1  # the live crossover the leader adopted
# per worker and backend: its count integrated over time, when it changed, and the prompt
# tokens it sent there so far (estimated)
_LIVED_FLOATS = 3
_OTHERS_FLOATS = 4  # per backend: the others' requests integrated, held now, since, until
_FLOATS = 12  # per backend: running, queued, capacity, the router's in flight, accept length,
# its time, the engine, the reading's time, the KV cache's tokens in use and its size, the
# draft depth in use, whether the server adapts it
_ENGINES = (None, "sglang", "vllm")
# a reading's counts: running, queued, capacity, the KV cache's tokens in use, its size
Counts = tuple[float | None, float | None, float | None, float | None, float | None]
_NONE = math.nan


@dataclass(frozen=True)
class Reading:
    """The leader's last reading of a backend's ``/metrics``; ``None`` where not reported
    (or not a count: NaN or infinity from a broken exporter)."""

    running: int | None
    queued: int | None
    max_running: int | None
    inflight: int  # the router's own requests in flight there when it was read
    accept_length: float | None
    accept_length_at: float  # monotonic time of the window the accept length is from
    engine: str | None  # "sglang", "vllm", or None when its metrics do not say
    at: float  # monotonic time of the scrape (the clock is the machine's, not the process's)
    used_tokens: int | None = None  # the KV cache's tokens in use, as the backend says
    max_tokens: int | None = None  # the KV cache's size in tokens
    spec_depth: float | None = None  # the draft depth in use (an adaptive server's moves)
    adaptive: bool | None = None  # whether the server adapts it (None: not known)

    @property
    def drafting(self) -> tuple[float | None, float | None]:
        """The accept length and the draft depth it was read at."""
        return self.accept_length, self.spec_depth


class Board:
    def __init__(self, workers: int, backends: int, worker: int = 0) -> None:
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} is not one of {workers}")
        self.workers, self.backends, self.worker = workers, backends, worker
        cells = workers * backends
        counts = _INTS * cells + _PUBLISHED_INTS * backends + _OWN_INTS * workers + _GLOBAL_INTS
        floats = _FLOATS * backends + _OWN_FLOATS * workers + _GLOBAL_FLOATS
        lived = _LIVED_FLOATS * cells
        others = _OTHERS_FLOATS * backends
        self._memory = mmap.mmap(-1, (counts + floats + lived + others) * 8)  # MAP_SHARED
        every = memoryview(self._memory)
        whole = every[: counts * 8].cast("q")
        sizes = (cells, cells, cells, backends, backends, workers, _GLOBAL_INTS)
        starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
        parts = (whole[a:b] for a, b in itertools.pairwise(starts))
        (
            self._inflight,
            self._kv,
            self._levels,
            self._health_seq,
            self._health_ok,
            self._posted,
            self._published,
        ) = parts
        self._floats = every[counts * 8 : (counts + _FLOATS * backends) * 8].cast("d")
        for i in range(_FLOATS * backends):
            self._floats[i] = _NONE
        self._cpu = every[(counts + _FLOATS * backends) * 8 :].cast("d")[:workers]
        self._live = every[(counts + floats - _GLOBAL_FLOATS) * 8 : (counts + floats) * 8].cast("d")
        self._live[0] = _NONE
        self._lived = every[(counts + floats) * 8 : (counts + floats + lived) * 8].cast("d")
        self._others = every[(counts + floats + lived) * 8 :].cast("d")  # zeros: none yet
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
        if self.workers == 1:  # read for every backend at every request: no slice to sum
            return self._inflight[backend]
        return sum(self._inflight[backend :: self.backends])

    def own_inflight(self, backend: int) -> int:
        return self._inflight[self._row + backend]

    def add_inflight(self, backend: int, n: int, kv_tokens: int, prompt_tokens: int = 0) -> None:
        cell = self._row + backend
        self._live_through(cell, time.monotonic())
        self._inflight[cell] += n
        self._kv[cell] += kv_tokens
        self._lived[_LIVED_FLOATS * cell + 2] += prompt_tokens

    def prompted(self, backend: int) -> float:
        """The prompt tokens (estimated) every worker sent to ``backend`` so far, from an
        origin of its own: only differences mean anything."""
        lived = self._lived
        if self.workers == 1:  # read at every stream's first byte and end
            return lived[_LIVED_FLOATS * backend + 2]
        return math.fsum(
            lived[_LIVED_FLOATS * cell + 2]
            for cell in range(backend, self.workers * self.backends, self.backends)
        )

    def lived(self, backend: int, now: float) -> float:
        """The requests in flight at ``backend`` through every worker, integrated over time
        up to ``now`` (request seconds, from an origin of its own: only differences mean
        anything)."""
        total, lived = 0.0, self._lived
        for cell in range(backend, self.workers * self.backends, self.backends):
            at = _LIVED_FLOATS * cell
            total += lived[at] + self._inflight[cell] * max(0.0, now - lived[at + 1])
        return total

    def _live_through(self, cell: int, now: float) -> None:
        """A slot's integral brought up to ``now``, before its count changes."""
        lived, at = self._lived, _LIVED_FLOATS * cell
        lived[at] += self._inflight[cell] * max(0.0, now - lived[at + 1])
        lived[at + 1] = now

    def kv_tokens(self, backend: int) -> int:
        """The estimated context of the requests in flight at ``backend``, every worker's."""
        if self.workers == 1:
            return self._kv[backend]
        return sum(self._kv[backend :: self.backends])

    def forget(self, worker: int) -> None:
        """A worker died: its requests died with it, so its slots are cleared for the one
        that takes its place."""
        start = worker * self.backends
        now = time.monotonic()
        for i in range(start, start + self.backends):
            self._live_through(i, now)
            self._inflight[i] = self._kv[i] = self._levels[i] = 0
        self._cpu[worker] = 0.0  # its successor's count starts again: a counter reset

    # CPU time, each worker's own

    def show_cpu(self, seconds: float) -> None:
        self._cpu[self.worker] = seconds

    def cpu_seconds(self) -> float:
        return math.fsum(self._cpu)

    # a column given to another server: the leader clears what it published of the last

    def clear(self, backend: int) -> None:
        self._health_seq[backend] = self._health_ok[backend] = 0
        for i in range(_FLOATS * backend, _FLOATS * (backend + 1)):
            self._floats[i] = _NONE
        for i in range(_OTHERS_FLOATS * backend, _OTHERS_FLOATS * (backend + 1)):
            self._others[i] = 0.0
        self._last[backend] = None

    # the set of backends, published by the leader (the set itself is a file)

    def publish_servers(self) -> None:
        self._published[0] += 1

    def servers_published(self) -> int:
        return self._published[0]

    # online calibration's fit, published by the leader (the fit itself is a file)

    def publish_online(self, adopted: float | None) -> None:
        """The live crossover the leader routes by now (None: the profile's)."""
        self._live[0] = _or_none(adopted)
        self._published[1] += 1  # after the crossover: a reader that sees one sees both

    def online_published(self) -> int:
        return self._published[1]

    def live_crossover(self) -> float | None:
        return _value(self._live[0])

    def news(self) -> tuple[int, int, int, int]:
        """Changes whenever anything is published for the workers (a set of backends, a
        profile posted, a health verdict, an online fit): one look at it tells a worker
        whether to follow."""
        published = self._published
        return published[0], sum(self._posted), sum(self._health_seq), published[1]

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
        counts: Counts,
        accept: tuple[float, float] | None,
        engine: str | None,
        at: float,
        believed_for: float = math.inf,
        drafting: tuple[float | None, bool | None] = (None, None),
    ) -> None:
        """What the leader read: running, queued and capacity, and the KV cache's tokens in
        use and its size, the live accept length and its time, the engine, the
        time, the draft depth in use and whether the server adapts it; with the router's
        requests in flight there now, and the other routers' requests it implies, held until
        ``believed_for`` seconds after."""
        f, i = self._floats, backend * _FLOATS
        depth, adaptive = drafting
        f[i + 10], f[i + 11] = _or_none(depth), _or_none(adaptive)
        f[i], f[i + 1], f[i + 2], f[i + 8], f[i + 9] = (_or_none(c) for c in counts)
        inflight = self.inflight(backend)
        f[i + 3] = inflight
        self._hold_others(backend, counts[0], counts[1], inflight, at, believed_for)
        f[i + 4], f[i + 5] = accept if accept is not None else (_NONE, 0.0)
        f[i + 6] = _ENGINES.index(engine) if engine in _ENGINES else 0
        f[i + 7] = at  # a reading is whole once its time is there

    def _hold_others(
        self,
        backend: int,
        running: float | None,
        queued: float | None,
        inflight: int,
        at: float,
        believed_for: float,
    ) -> None:
        """The others' requests integrated up to ``at``, then held at what this reading
        says (none when it says no running count, as the policy counts none then)."""
        o, j = self._others, backend * _OTHERS_FLOATS
        o[j] = self._others_at(j, at)
        reported = math.nan if running is None else running + (queued or 0.0)
        o[j + 1] = max(0.0, reported - inflight) if math.isfinite(reported) else 0.0
        o[j + 2], o[j + 3] = at, at + believed_for

    def others(self, backend: int, now: float) -> float:
        """The other routers' requests at ``backend`` now, as the leader's last reading
        says (0 once it is no longer believed, or before the first)."""
        o, j = self._others, backend * _OTHERS_FLOATS
        return o[j + 1] if o[j + 2] <= now <= o[j + 3] else 0.0

    def others_lived(self, backend: int, now: float) -> float:
        """The other routers' requests at ``backend`` integrated over time up to ``now``
        (request seconds: only differences mean anything, as ``lived``'s)."""
        return self._others_at(backend * _OTHERS_FLOATS, now)

    def _others_at(self, j: int, now: float) -> float:
        o = self._others
        since, until = o[j + 2], o[j + 3]
        return o[j] + o[j + 1] * max(0.0, min(now, until) - since)

    def reading(self, backend: int) -> Reading | None:
        f, i = self._floats, backend * _FLOATS
        at = f[i + 7]
        if math.isnan(at):
            return None
        last = self._last[backend]
        if last is None or last.at != at:  # read at every request: made once a scrape
            counts = _count(f[i]), _count(f[i + 1]), _count(f[i + 2])
            tokens = _count(f[i + 8]), _count(f[i + 9])
            engine = _ENGINES[int(f[i + 6])]
            accept = _value(f[i + 4]), f[i + 5]
            adaptive = None if math.isnan(f[i + 11]) else bool(f[i + 11])
            drafting = _value(f[i + 10]), adaptive
            last = Reading(*counts, int(f[i + 3]), *accept, engine, at, *tokens, *drafting)
            self._last[backend] = last
        return last


def _or_none(value: float | None) -> float:
    return _NONE if value is None else value


def _value(stored: float) -> float | None:
    return None if math.isnan(stored) else stored


def _count(stored: float) -> int | None:
    return int(stored) if math.isfinite(stored) else None
