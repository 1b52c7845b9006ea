"""Where the workers of one router record their online samples for the leader: one ring of
fixed-size slots per worker in a block of shared memory, made before the workers fork.

The request path writes one slot of its own worker's ring and then its count, and takes no
lock: a ring has one writer (the worker serves from one thread), and the count, an aligned
8-byte store made after the slot, says which slots are whole. The leader reads every ring at
each fit (``fresh``): the slots written since it last read, and of those only the ones the
count after its copy shows were not written again meanwhile, so a slot being overwritten is
never taken half old, half new. A ring holds as many samples as ``Samples`` keeps in all, so
a worker's samples that its ring forgets before the leader reads them are older than the
last ``keep`` of the whole router and would have been forgotten by count anyway.

A worker started again in place of one that died goes on writing at its ring's count, and
a leader started again reads every ring from its oldest slot: the samples outlive both.

The rings are also the router's log of its own samples for its peer replicas (``after``):
any worker reads them there without taking them, from a cursor of each ring's count that
names the rings' ``epoch`` (made with them, so the same in every worker, and new when the
router starts again: a cursor of another epoch reads from the oldest slot). A router of
one worker keeps one ring for that alone.
"""

from __future__ import annotations

import math
import mmap
import secrets
import struct

from specroute.online.samples import Sample
from specroute.policies.view import POOLS

# monotonic time, pool, mean load, TPOT, context, accept length (NaN: unknown), load beside,
# draft depth (NaN: unknown), prefill beside (NaN: unknown)
_SLOT = struct.Struct("=9d")
_CODES = {pool: float(i) for i, pool in enumerate(POOLS)}


class Rings:
    def __init__(self, workers: int, capacity: int, worker: int = 0) -> None:
        """``capacity``: the slots of each worker's ring."""
        if capacity < 1:
            raise ValueError(f"a ring needs a slot at least, got {capacity}")
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} is not one of {workers}")
        self.workers, self.capacity, self.worker = workers, capacity, worker
        self.epoch = secrets.token_hex(8)  # this set of rings', for a peer's cursor
        self._slots = capacity + 1  # one spare: the slot being written is not one of the kept
        head = workers * 8
        self._memory = mmap.mmap(-1, head + workers * self._slots * _SLOT.size)  # MAP_SHARED
        self._written = memoryview(self._memory)[:head].cast("q")  # each ring's count
        self._head = head
        self._read = [0] * workers  # the leader's: each ring's count when it last read it

    def become(self, worker: int) -> None:
        """In a forked worker: write from now on in the ring of ``worker``."""
        if not 0 <= worker < self.workers:
            raise ValueError(f"worker {worker} is not one of {self.workers}")
        self.worker = worker

    def add(self, sample: Sample) -> None:
        """One sample in this worker's ring (the request path: one slot, then the count)."""
        w, n = self.worker, self._written[self.worker]
        offset = self._head + (w * self._slots + n % self._slots) * _SLOT.size
        at, pool, load, tpot, context, accept, beside, depth, prefill = sample
        stored = math.nan if accept is None else accept  # a double: NaN for unknown
        deep = math.nan if depth is None else depth
        prompts = math.nan if prefill is None else prefill
        code = _CODES[pool]
        _SLOT.pack_into(
            self._memory, offset, at, code, load, tpot, context, stored, beside, deep, prompts
        )
        self._written[w] = n + 1  # after the slot: a reader that counts it finds it whole

    def written(self, worker: int) -> int:
        """The samples ``worker``'s ring was given so far, the forgotten ones too."""
        return self._written[worker]

    def fresh(self) -> list[Sample]:
        """Every ring's samples written since the last call, the oldest first."""
        found: list[Sample] = []
        for w in range(self.workers):
            found.extend(self._fresh(w))
        found.sort(key=lambda s: s.at)
        return found

    def after(self, cursor: str | None) -> tuple[list[Sample], str]:
        """Every ring's samples written since ``cursor`` (None, or one of another epoch: all
        they hold), the oldest first, and the cursor to ask from next; taken by nobody. A
        cursor of this epoch that does not read raises ValueError."""
        counts = self._counts(cursor)
        found: list[Sample] = []
        for w in range(self.workers):
            rows, counts[w] = self._since(w, counts[w])
            found.extend(rows)
        found.sort(key=lambda s: s.at)
        return found, f"{self.epoch}:{'.'.join(str(c) for c in counts)}"

    def _counts(self, cursor: str | None) -> list[int]:
        epoch, _, given = (cursor or "").partition(":")
        if epoch != self.epoch:
            return [0] * self.workers
        try:
            counts = [int(c) for c in given.split(".")]
        except ValueError:
            raise ValueError(f"a cursor of {self.workers} counts, got {given!r}") from None
        if len(counts) != self.workers or min(counts) < 0:
            raise ValueError(f"a cursor of {self.workers} counts, got {given!r}")
        return [min(c, self._written[w]) for w, c in enumerate(counts)]

    def _fresh(self, w: int) -> list[Sample]:
        rows, self._read[w] = self._since(w, self._read[w])
        return rows

    def _since(self, w: int, read: int) -> tuple[list[Sample], int]:
        """Ring ``w``'s whole slots written since its count was ``read``, and its count."""
        cap, slots = self.capacity, self._slots
        base, size, memory = self._head + w * slots * _SLOT.size, _SLOT.size, self._memory
        end = self._written[w]
        start = max(read, end - cap)  # older ones were written over
        rows = [_SLOT.unpack_from(memory, base + (i % slots) * size) for i in range(start, end)]
        after = self._written[w]  # the slots written again while copying, or being written
        first = max(start, after - cap)  # (the writer of sample ``after`` is at ``after - slots``)
        return [
            Sample(
                at,
                POOLS[int(pool)],
                load,
                tpot,
                int(context),
                _known(accept),
                beside,
                _known(deep),
                _known(prefill),
            )
            for at, pool, load, tpot, context, accept, beside, deep, prefill in rows[
                first - start :
            ]
        ], end


def _known(stored: float) -> float | None:
    return None if math.isnan(stored) else stored
