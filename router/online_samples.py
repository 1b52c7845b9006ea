"""The served requests the live curves are fitted from: one ``Sample`` per answered request,
taken at its end, in a bounded buffer that forgets by count and by age."""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

from specroute.policies.view import Pool

_USAGE = b'"completion_tokens"'


class Sample(NamedTuple):
    at: float  # monotonic seconds, at the request's end
    pool: Pool
    load: int  # the load it joined where it ran, itself included
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

    def window(self, now: float) -> list[Sample]:
        """The samples in the window at ``now``; older ones are dropped for good."""
        kept, oldest = self._kept, now - self.max_age
        while kept and kept[0].at < oldest:
            kept.popleft()
        return list(kept)

    def __len__(self) -> int:
        return len(self._kept)


def output_tokens(tail: bytes) -> int | None:
    """The answer's ``usage.completion_tokens``, read from its last bytes (a whole body ends
    with its usage; a stream sends it last when the client asks, ``stream_options.
    include_usage``); None when they do not say."""
    at = tail.rfind(_USAGE)
    if at < 0:
        return None
    digits = tail[at + len(_USAGE) :].lstrip(b": \t")
    end = 0
    while end < len(digits) and 48 <= digits[end] <= 57:
        end += 1
    return int(digits[:end]) if 0 < end <= 12 else None
