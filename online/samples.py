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


# the most of the other pool's requests, mean over a sample's decode, beside which it is
# still taken for one of its pool alone on shared GPUs: one beside it a twentieth of the time
BESIDE_LIMIT = 0.05


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
