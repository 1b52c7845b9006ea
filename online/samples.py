"""The served requests the live curves are fitted from: one ``Sample`` per answered request,
taken at its end, in a bounded buffer that forgets by count and by age.

A speculative sample carries its server's live accept length at its end, and the draft
depth the server ran at then: a sample taught by another drafter than the one serving now
(an accept length far from the current one, read at the same depth) is left out of the fit
while acceptance stays away (``taught_elsewhere``), and kept, so that it counts again when
acceptance comes back. An accept length read at another depth is not compared: an adaptive
server's (``--speculative-adaptive``) falls with its depth, not with its drafter."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

from specroute.policies.view import Pool


class Sample(NamedTuple):
    at: float  # monotonic seconds, at the request's end
    pool: Pool
    load: float  # the mean load it decoded under where it ran, itself included
    tpot: float  # seconds per output token after the first
    context: int  # its estimated KV tokens while decoding
    # its server's live accept length at its end: None when unknown, and on the plain pool
    accept_length: float | None = None
    # of ``load``, the mean the other pool's servers on the same GPUs held: their steps and
    # its server's took turns (0 on GPUs of its own)
    beside: float = 0.0
    # the draft depth its server ran at at its end (SGLang's spec_num_steps): None when
    # unknown, and on the plain pool
    depth: float | None = None
    # the prompt tokens sent to its GPUs while it decoded (both pools' on shared GPUs, its
    # server's on its own; this router's requests), per output token after its first: the
    # prefill its decode waited for (None: unknown)
    prefill: float | None = None


# two readings of the load a request lived through (``Online.lived``): its own pool's part
# and the other pool's on its GPUs, each integrated over time, and the prompt tokens sent
# to those GPUs so far
Reading = tuple[float, float, float]


def decoded_under(
    first: Reading, last: Reading, seconds: float, tokens: int
) -> tuple[float, float, float | None]:
    """What a request of ``tokens`` output tokens decoded under between ``first`` (its first
    token's reading) and ``last`` (its end's), ``seconds`` apart: the mean load, itself
    included; the other pool's part of it; and the prompt tokens sent to its GPUs meanwhile
    per output token after its first (None: fewer than two tokens)."""
    (own, other, prompts), (own_first, other_first, prompts_first) = last, first
    load = (own + other - own_first - other_first) / seconds
    prefill = (prompts - prompts_first) / (tokens - 1) if tokens > 1 else None
    return load, (other - other_first) / seconds, prefill


# the most of the other pool's requests, mean over a sample's decode, beside which it is
# still taken for one of its pool alone on shared GPUs: one beside it a twentieth of the time
BESIDE_LIMIT = 0.05


Row = tuple[Pool, int, int]  # a pool, and a sample's load and context each to a doubling


class Samples:
    """The samples younger than ``max_age`` seconds, at most ``per_row`` of each row (a pool
    at a load and a context, each to a doubling) and ``keep`` in all: the newest of each
    (the fit counts at most the last few of each pool and level: ``Online.per_level``).

    A row forgets by its own count, so that a pool seen rarely at a level (the speculative
    server under a low crossover, seen in exploration's turns) keeps its evidence while the
    other pool's traffic at other levels floods in; a row the traffic keeps filling follows
    drift as fast as before. Which samples are kept does not depend on the order they came
    in (each rule keeps the newest), so the leader keeps what one worker would."""

    def __init__(self, keep: int, max_age: float, per_row: int | None = None) -> None:
        self.keep, self.max_age = keep, max_age
        self.per_row = keep if per_row is None else per_row
        self._rows: dict[Row, deque[Sample]] = {}  # each the oldest first
        self._count = 0

    def add(self, sample: Sample) -> None:
        self.merge((sample,))

    def merge(self, samples: Iterable[Sample]) -> None:
        """Samples, late ones too (the workers' rings at a fit, the peer replicas'), each
        put in time order in its row."""
        new: dict[Row, list[Sample]] = {}
        for sample in samples:
            new.setdefault(_row(sample), []).append(sample)
        for row, given in new.items():
            given.sort(key=_at)
            kept = self._rows.get(row)
            before = 0 if kept is None else len(kept)
            if kept is None:
                kept = self._rows[row] = deque(maxlen=self.per_row)
            elif given[0].at < kept[-1].at:  # late: each into its place
                merged = heapq.merge(kept, given, key=_at)
                kept, given = deque(merged, maxlen=self.per_row), []
                self._rows[row] = kept
            kept.extend(given)
            self._count += len(kept) - before
        while self._count > self.keep:
            self._drop(min(self._rows, key=lambda row: self._rows[row][0].at))

    def window(self, now: float) -> list[Sample]:
        """The samples in the window at ``now``, oldest first; older ones are dropped for
        good."""
        oldest = now - self.max_age
        for row, kept in list(self._rows.items()):
            while kept and kept[0].at < oldest:
                self._drop(row)
        return list(heapq.merge(*self._rows.values(), key=_at))

    def _drop(self, row: Row) -> None:
        """The oldest of ``row``."""
        kept = self._rows[row]
        kept.popleft()
        self._count -= 1
        if not kept:
            del self._rows[row]

    def __len__(self) -> int:
        return self._count


def taught_elsewhere(
    sample: Sample, accept_length: float | None, tolerance: float, depth: float | None = None
) -> bool:
    """Whether ``sample`` was taught by another drafter than the one at ``accept_length``
    (the speculative pool's now, at draft depth ``depth``; None: unknown): its own accept
    length differs from it by more than ``tolerance``, relative (0: never). A sample without
    one counts always, and so does one read at another depth than ``depth``."""
    if accept_length is None or tolerance <= 0 or sample.pool != "spec":
        return False
    if depth is not None and sample.depth is not None and sample.depth != depth:
        return False
    own = sample.accept_length
    return own is not None and abs(own - accept_length) > tolerance * accept_length


def beside_other(sample: Sample) -> bool:
    """Whether ``sample`` was taken beside the other pool's requests on its GPUs: more than
    ``BESIDE_LIMIT`` of them, mean over its decode (an unknown number: beside). Servers
    sharing GPUs take turns with their steps, so a step waits for the other server's: one
    request of the other pool beside it all along adds a step of the other's to each of its
    tokens, which is not what a level of its pool alone means."""
    return not sample.beside <= BESIDE_LIMIT


def _at(sample: Sample) -> float:
    return sample.at


def _row(sample: Sample) -> Row:
    return (sample.pool, _doubling(sample.load), _doubling(sample.context))


def _doubling(x: float) -> int:
    """``x``'s doubling, its nearest power of two in log (0 below 1, and for no number)."""
    return round(math.log2(x)) if 1 < x < math.inf else 0
