"""The rings of online samples in shared memory: written by forked workers as the router's
are, each its own ring with no lock, read whole by the leader."""

from __future__ import annotations

import itertools
import multiprocessing
import random
import time

import pytest

from specroute.online.estimator import Online, OnlineMode, Sureness
from specroute.online.samples import Sample, Samples
from specroute.policies.view import POOLS
from specroute.router.online.rings import Rings

FORK = multiprocessing.get_context("fork")  # inherited, as the workers inherit theirs


def numbered(worker: int, j: int) -> Sample:
    """The ``j``-th sample of ``worker``: every field says which one it is."""
    return Sample(float(j), POOLS[j % 2], j, j / 2, worker * 1_000_000 + j)


def write(rings: Rings, worker: int, first: int, n: int) -> None:
    rings.become(worker)
    for j in range(first, first + n):
        rings.add(numbered(worker, j))


def in_workers(rings: Rings, *jobs: tuple[int, int, int]) -> None:
    """Each ``(worker, first, n)`` in a forked process of its own, all at once."""
    processes = [FORK.Process(target=write, args=(rings, *job)) for job in jobs]
    for p in processes:
        p.start()
    for p in processes:
        p.join(10)
        assert p.exitcode == 0


def test_the_reader_finds_every_worker_s_samples_once_and_a_ring_keeps_its_last() -> None:
    rings = Rings(3, 64)
    in_workers(rings, (0, 0, 40), (1, 0, 40), (2, 0, 40))
    found = rings.fresh()
    assert sorted(s.context for s in found) == sorted(
        w * 1_000_000 + j for w in range(3) for j in range(40)
    )
    assert [s.at for s in found] == sorted(s.at for s in found)  # the oldest first
    assert all(s == numbered(s.context // 1_000_000, int(s.at)) for s in found)
    assert rings.fresh() == []  # each is read once
    in_workers(rings, (1, 40, 100))  # worker 1 started again: it goes on in its ring
    assert rings.written(1) == 140
    assert [s.context - 1_000_000 for s in rings.fresh()] == list(range(76, 140))  # its last 64


@pytest.mark.parametrize(
    ("keep", "max_age", "counted"),
    [
        pytest.param(50, 1000.0, 50, id="by-count"),  # the last 50 of 600
        pytest.param(500, 3.0, 30, id="by-age"),  # the last 3 s: 30 at one a 0.1 s
    ],
)
def test_the_leader_s_window_is_the_one_one_worker_would_keep(
    keep: int, max_age: float, counted: int
) -> None:
    """The leader's samples from three rings, taken in at two fits, are those one worker's
    ``Samples`` keeps when given every sample in time order."""
    rng = random.Random(7)
    every = [Sample(t * 0.1, POOLS[t % 2], 1 + t % 9, 0.01, rng.randrange(3)) for t in range(600)]
    rings = Rings(3, keep)  # as the router's: a ring holds what the leader keeps
    online = Online(OnlineMode.OBSERVE, Samples(keep, max_age), Sureness(4), rings=rings)
    alone = Samples(keep, max_age)
    for part, now in ((every[:250], 25.0), (every[250:], 60.0)):
        for w in range(3):
            rings.become(w)  # the worker that served it (its context here) records it
            for s in part:
                if s.context == w:
                    online.record(s)
        for s in part:
            alone.add(s)
        online.refit(now, None, shared=True)
        assert online.samples.window(now) == alone.window(now)
    assert len(online.samples) == online.fits[0].samples == counted


def hammer(rings: Rings, seconds: float) -> None:
    rings.become(0)
    j, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        for _ in range(100):
            rings.add(numbered(0, j))
            j += 1


def test_a_slot_being_written_over_is_never_taken() -> None:
    """A writer laps a small ring many times while the leader reads it: every sample read
    is whole (its fields agree) and in order, none twice, none that was written over."""
    rings = Rings(1, 16)
    writer = FORK.Process(target=hammer, args=(rings, 0.5))
    writer.start()
    seen: list[Sample] = []
    reads = 0
    while writer.is_alive():
        seen.extend(rings.fresh())
        reads += 1
    writer.join(10)
    assert writer.exitcode == 0
    last = rings.written(0)
    tail = rings.fresh()  # once it stopped: up to its last whole ring
    assert len(tail) <= 16 and [int(s.at) for s in tail] == list(range(last - len(tail), last))
    seen += tail
    assert all(s == numbered(0, int(s.at)) for s in seen)  # none torn
    order = [int(s.at) for s in seen]
    assert all(a < b for a, b in itertools.pairwise(order))  # none written over
    assert order[-1] == last - 1
    assert reads > 100 and len(seen) < last  # it lapped the reader, many times over
