"""The served requests the live curves are fitted from: one ``Sample`` per answered request,
taken at its end, in a bounded buffer that forgets by count and by age."""

from __future__ import annotations

import heapq
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


class Samples:
    """The last ``keep`` samples, of which those younger than ``max_age`` seconds count
    (the fit counts at most the last few of each pool and level: ``Online.per_level``)."""

    def __init__(self, keep: int, max_age: float) -> None:
        self.max_age = max_age
        self._kept: deque[Sample] = deque(maxlen=keep)  # the oldest first

    def add(self, sample: Sample) -> None:
        self._kept.append(sample)

    def merge(self, samples: Iterable[Sample]) -> None:
        """Samples that come late (the workers' rings at a fit, the peer replicas'), put in
        time order among those kept, so that the window forgets the oldest first, by count
        and by age, whoever served them."""
        new = sorted(samples, key=_at)
        kept = self._kept
        if not new:
            return
        if not kept or kept[-1].at <= new[0].at:
            kept.extend(new)
            return
        self._kept = deque(heapq.merge(kept, new, key=_at), maxlen=kept.maxlen)

    def window(self, now: float) -> list[Sample]:
        """The samples in the window at ``now``; older ones are dropped for good."""
        kept, oldest = self._kept, now - self.max_age
        while kept and kept[0].at < oldest:
            kept.popleft()
        return list(kept)

    def __len__(self) -> int:
        return len(self._kept)


def _at(sample: Sample) -> float:
    return sample.at
