"""The live curves and their crossing, fitted from served requests: pure Python (the router
must not load numpy), by the profile's statistics and the project's one crossing finder.

Each sample is one answered request: its pool, the mean load it decoded under and its time
per output token. A sample counts at the level nearest its load in log load (levels are
spaced geometrically, as calibration measures them), read at the level itself: with a
profile, its TPOT times the profile's curve at the level over the curve at its load, so
that a pool whose samples sit low in a level's share of the axis (the plain server, below
the crossover's spill-over) is not taken for faster there. A level's statistic is the
median TPOT of its samples, as a profile's is. Its bootstrap replicates are drawn by the
distribution of a resampled median: the median of ``n`` values drawn with replacement from
sorted ``x`` is ``x[k]`` with ``k`` near ``(n - 1) / 2`` and a spread of ``sqrt(n) / 2``
ranks (binomial, its normal limit), so a replicate costs one draw instead of ``n``. The crossing is
``specroute.crossing`` on the margin of the two curves (the log of their ratio), once for the
medians and once per replicate; its interval is the percentile interval of the replicates'
crossings, each end out to the level past it (``crossing.percentile_interval``,
``crossing.snapped``): the profile's rule, so that the two intervals can be compared.

Each sample carries the prompt tokens sent to its GPUs while it decoded, per output token
after its first (``Sample.prefill``): a request's decode waits for the prompts its GPUs
prefill meanwhile. The stated model is that each such token adds the same time to a token
decoded beside it, whichever pool it is: TPOT is a level's and pool's own plus ``slope``
times the prefill. The slope is fitted by least squares within each pool's level (pooled
over them, never below 0) and shown (``LiveFit.prefill_slope``). With ``at_prefill``
(``--online-at-prefill``), before the medians each sample moves along it to the mean prefill
of its level's samples of both pools, so that the two pools are compared at the same
prefill, that of the traffic at that level (a move of at most a factor of two either way; a
sample with no prefill known stays as measured): which requests a routing leaves to a pool
depends on the prompts that came while they decoded (a plain request is left out as taken
beside the other pool when a request went to the speculative server during its decode,
which happens at arrivals, so that on bursty traffic the plain samples that count decoded
through fewer prompts). Without it the samples are read as measured.

A pool seldom seen at a level (the plain server at low load, under a crossover policy) takes
the profile's curve there, when the profile has one, as a known value without spread: it is
the speculative server's curve that drifts with acceptance, and it is seen where it
speculates.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from itertools import pairwise

from specroute.crossing import (
    ONE_SIDED,
    Band,
    Crossing,
    at_or_beyond,
    between,
    beyond,
    crossing,
    crossings,
    log_margin,
    percentile_interval,
    snapped,
)
from specroute.online.samples import Sample
from specroute.policies.profile import up_to
from specroute.policies.view import POOLS, Pool

DEFAULT_LEVELS: tuple[float, ...] = tuple(float(2**i) for i in range(10))  # 1 to 512
REPLICATES = 400
Known = Callable[[Pool, float], float | None]  # the profile's TPOT at a load, if it has one
Live = frozenset[tuple[Pool, float]]  # the pools' levels a fit counted live
Shape = Callable[[Pool, float], float]  # the profile's TPOT at any load, its curve extended


@dataclass(frozen=True)
class Level:
    """One pool at one level: its live samples, their median TPOT and its interval
    (seconds); ``median`` is None with no sample."""

    level: float
    samples: int
    median: float | None
    low: float | None
    high: float | None


@dataclass(frozen=True)
class LiveEdge:
    """One edge of live bands (a mixture-of-experts model's margin may turn more than once):
    where speculation stops paying going up in load (``down``) or starts (``up``), its
    interval from the replicates' same turn nearest it (an end None: open, a replicate that
    does not turn there), and the fewest live samples of either pool at the two levels
    around it."""

    at: float
    direction: str
    low: float | None
    high: float | None
    near: int


@dataclass(frozen=True)
class LiveCrossing:
    """The live crossover and its interval (an end None: open), or a bound when the margin
    does not change sign among the levels used; ``levels`` are those the margin was taken
    at, ``near``: the fewest live samples of either pool at the two levels around it (at the
    bound's level for a bound), none where a pool took the profile's value: a crossing is
    only as sure as the live evidence on both sides of it; ``beyond``: for a bound, the
    share of replicates that find it too. When the margin turns up (speculation starts
    paying above some load: a mixture-of-experts model's bands), ``edges`` holds every turn,
    ``at`` is the first fall, if any, and ``beyond`` the share of replicates paying at the
    last level, where the last band ends when it pays there (1 when it does not)."""

    at: float | None
    low: float | None
    high: float | None
    bound: str | None
    limit: float | None
    levels: tuple[float, ...]
    near: int
    beyond: float = 0.0
    edges: tuple[LiveEdge, ...] = ()
    paid_first: bool = True  # banded: whether speculation paid at the first level used

    @property
    def threshold(self) -> float | None:
        """The load to route by, as a profile's (``Crossover.threshold``): the crossover;
        for a bound, never past the evidence: when it pays at every level seen, the last
        one (where both pools were seen); when at none, the load below the first one, so
        that a request that would make that level goes to the plain pool (below it nothing
        was seen: the level a lone request makes, 1, gives 0, speculation nowhere). With
        bands, the first band's top."""
        if self.edges:
            route = self.bands
            top = route[0][1] if route else 0.0
            return math.inf if top is None else top
        if self.at is not None:
            return self.at
        limit = self.limit if self.limit is not None else 0.0
        return limit if self.bound == "above" else max(0.0, limit - 1)

    @property
    def bands(self) -> tuple[Band, ...]:
        """The loads to speculate at, never past the evidence: below the first level used
        as at it (open below when it paid there, as a crossover is); a band that still pays
        at the last level ends there; speculation nowhere is no band."""
        if not self.edges:
            top = self.threshold
            assert top is not None
            return up_to(top)
        turns = [(e.at, e.direction) for e in self.edges]
        return tuple(between(turns, self.paid_first, self.levels[-1]))


@dataclass(frozen=True)
class LiveFit:
    """The live curves of one context (None: all contexts together) and their crossing
    (None: no level has a value for both pools); ``min_samples``: the live samples a pool's
    level counted with (with fewer, the profile's value stood there)."""

    context: float | None
    curves: dict[Pool, tuple[Level, ...]]
    crossing: LiveCrossing | None
    samples: int
    min_samples: int = 1
    live: tuple[tuple[Pool, float], ...] = ()  # the pools' levels it counted live
    # seconds a token decoded waits per prompt token prefilled beside it, as fitted (0:
    # no prefill known, or none that slows the decode)
    prefill_slope: float = 0.0


def nearest(levels: Sequence[float], load: float) -> int:
    """The index of the level nearest ``load`` in log load (ascending levels)."""
    return bisect_left(_midpoints(tuple(levels)), load)


@cache
def _midpoints(levels: tuple[float, ...]) -> tuple[float, ...]:
    """Where one level's share of the log-load axis ends and the next one's begins."""
    return tuple(math.sqrt(a * b) for a, b in pairwise(levels))


def fit(
    samples: Sequence[Sample],
    levels: Sequence[float],
    context: float | None = None,
    known: Known | None = None,
    min_samples: int = 1,
    per_level: int | None = None,
    seed: int = 0,
    shape: Shape | None = None,
    stay: Live = frozenset(),
    banded: bool | None = False,
    at_prefill: bool = False,
) -> LiveFit:
    """The live curves of ``samples`` (oldest first) at ``levels`` and their crossing, each
    pool's level from its last ``per_level`` samples (all: None), each read at its level
    along ``shape`` (as measured: None); a pool's level with fewer than ``min_samples`` live
    samples takes ``known`` there (the profile's curve), but for one of ``stay`` (live in the
    last fit), which counts down to half as many: a level enters at the full count and
    leaves at half, so that the levels of the fit do not flap with a level's count.
    ``banded``: the routing in force has bands (a mixture-of-experts model's), so a margin
    that turns up is taken as bands; otherwise as one crossover, its first fall (a dense
    model's margin falls once, and a turn up in it is noise the fit must not route by); None:
    it speculates nowhere (no profile), so the class is the margin's: bands where it turns
    up first from a level where surely it loses. ``at_prefill``: read each sample at its
    level's prefill, and a dense margin that turns more than once as its one fall
    (``one_fall``), for bursty traffic."""
    seen: dict[Pool, list[list[Sample]]] = {pool: [[] for _ in levels] for pool in POOLS}
    for s in samples:
        seen[s.pool][nearest(levels, s.load)].append(s)
    if per_level is not None:
        seen = {pool: [row[-per_level:] for row in rows] for pool, rows in seen.items()}
    slope = prefill_slope(seen)
    if slope > 0 and at_prefill:
        seen = _at_prefill(seen, slope)
    along = _own_shape(seen) if shape is None else shape
    by = {
        pool: [_at_level(row, pool, level, along) for row, level in zip(rows, levels, strict=True)]
        for pool, rows in seen.items()
    }
    rng = random.Random(seed)
    curves: dict[Pool, tuple[Level, ...]] = {}
    draws: dict[Pool, list[list[float] | None]] = {}
    for pool in POOLS:
        rows, reps = [], []
        for level, values in zip(levels, by[pool], strict=True):
            values.sort()
            replicates = _median_replicates(values, rng) if values else None
            if replicates is None:
                rows.append(Level(level, 0, None, None, None))
            else:
                low, high = percentile_interval(replicates)
                rows.append(Level(level, len(values), _median(values), low, high))
            least = max(1, min_samples // 2) if (pool, level) in stay else min_samples
            reps.append(replicates if len(values) >= least else None)
        curves[pool], draws[pool] = tuple(rows), reps
    counted = sum(level.samples for rows in curves.values() for level in rows)
    found = _crossing(levels, curves, draws, known, min_samples, banded, at_prefill)
    counted_live = tuple(
        (pool, level) for pool in POOLS for level, r in zip(levels, draws[pool], strict=True) if r
    )
    return LiveFit(context, curves, found, counted, min_samples, counted_live, slope)


# the fewest samples with their prefill known, over the pools' levels with two or more, that
# a slope is fitted from
SLOPE_SAMPLES = 16
# the most a sample's TPOT is moved to its level's prefill: a factor either way
MOST_MOVED = 2.0


def prefill_slope(seen: dict[Pool, list[list[Sample]]]) -> float:
    """Seconds of TPOT per prompt token prefilled per output token: least squares of TPOT
    on prefill within each pool's level, pooled over them (so that the level and the pool,
    which set TPOT by themselves, do not pass for prefill), at least 0; 0 with fewer than
    ``SLOPE_SAMPLES`` samples with their prefill known, or none that varies."""
    covariance = variance = 0.0
    used = 0
    for rows in seen.values():
        for row in rows:
            known = [(s.prefill, s.tpot) for s in row if s.prefill is not None]
            if len(known) < 2:
                continue
            used += len(known)
            x_mean = math.fsum(x for x, _ in known) / len(known)
            y_mean = math.fsum(y for _, y in known) / len(known)
            covariance += math.fsum((x - x_mean) * (y - y_mean) for x, y in known)
            variance += math.fsum((x - x_mean) ** 2 for x, _ in known)
    if used < SLOPE_SAMPLES or variance <= 0:
        return 0.0
    return max(0.0, covariance / variance)


def _at_prefill(
    seen: dict[Pool, list[list[Sample]]], slope: float
) -> dict[Pool, list[list[Sample]]]:
    """Each sample's TPOT moved along ``slope`` to the mean prefill of its level's samples
    of both pools (a sample with none known stays)."""
    rows = list(zip(*seen.values(), strict=True))  # per level, each pool's row
    means: list[float | None] = []
    for level in rows:
        known = [s.prefill for row in level for s in row if s.prefill is not None]
        means.append(math.fsum(known) / len(known) if known else None)

    def moved(s: Sample, mean: float | None) -> Sample:
        if mean is None or s.prefill is None:
            return s
        tpot = s.tpot - slope * (s.prefill - mean)
        return s._replace(tpot=min(max(tpot, s.tpot / MOST_MOVED), s.tpot * MOST_MOVED))

    return {
        pool: [[moved(s, mean) for s in row] for row, mean in zip(pool_rows, means, strict=True)]
        for pool, pool_rows in seen.items()
    }


def _own_shape(seen: dict[Pool, list[list[Sample]]]) -> Shape:
    """Without a profile, each pool's TPOT at any load along its own live curve: through each
    level's median load and median TPOT, straight in log TPOT over log load between them and
    on past its ends (a stated model: TPOT a power of load, never falling with it, between
    two levels); a pool seen at one level only is read as measured. A level's
    samples sit anywhere in its share of the axis (a pool seen at the top of a level's share,
    the other at its bottom, would otherwise be compared at different loads)."""
    points: dict[Pool, list[tuple[float, float]]] = {}
    for pool, rows in seen.items():
        points[pool] = [
            (
                math.log(_median(sorted(s.load for s in row))),
                math.log(_median(sorted(s.tpot for s in row))),
            )
            for row in rows
            if row and all(s.load > 0 and s.tpot > 0 for s in row)
        ]

    def at(pool: Pool, load: float) -> float:
        known = points[pool]
        if len(known) < 2:
            return 1.0  # one level or none: no shape to read along
        x = math.log(max(load, 1e-9))
        i = next((k for k in range(1, len(known) - 1) if x <= known[k][0]), len(known) - 1)
        (x0, y0), (x1, y1) = known[i - 1], known[i]
        slope = max(0.0, (y1 - y0) / (x1 - x0)) if x1 > x0 else 0.0
        return math.exp(y0 + slope * (x - x0))

    return at


def _at_level(row: Sequence[Sample], pool: Pool, level: float, shape: Shape | None) -> list[float]:
    """The TPOTs of ``row``, each read at ``level`` along ``shape`` (as measured: None)."""
    if shape is None:
        return [s.tpot for s in row]
    there = shape(pool, level)
    return [s.tpot * there / shape(pool, s.load) for s in row]


def _crossing(
    levels: Sequence[float],
    curves: dict[Pool, tuple[Level, ...]],
    draws: dict[Pool, list[list[float] | None]],
    known: Known | None,
    min_samples: int,
    banded: bool | None = False,
    falls_once: bool = False,
) -> LiveCrossing | None:
    """The crossing at the levels where both pools are live (``banded``: every turn of the
    margin, bands; ``falls_once``: one crossover, ``one_fall``); where none is, at those
    where both have a value, live or known (the profile's), an estimate that is never sure
    (no level around it has both pools live): a crossing is never fitted past the evidence."""
    used: list[int] = []
    points: dict[Pool, list[float]] = {pool: [] for pool in POOLS}
    columns: dict[Pool, list[list[float]]] = {pool: [] for pool in POOLS}
    both = any(all(draws[pool][i] is not None for pool in POOLS) for i in range(len(levels)))
    for i, level in enumerate(levels):
        row: dict[Pool, tuple[float, list[float]]] = {}
        for pool in POOLS:
            live, reps = curves[pool][i], draws[pool][i]
            if reps is not None and live.median is not None:
                row[pool] = (live.median, reps)
            elif not both and known is not None and (value := known(pool, level)) is not None:
                row[pool] = (value, [value] * REPLICATES)
        if len(row) == len(POOLS):
            used.append(i)
            for pool, (value, reps) in row.items():
                points[pool].append(value)
                columns[pool].append(reps)
    if not used:
        return None
    at = [levels[i] for i in used]
    margin = log_margin(points["spec"], points["base"])
    found = crossing(at, margin)
    margins = [
        log_margin([c[r] for c in columns["spec"]], [c[r] for c in columns["base"]])
        for r in range(REPLICATES)
    ]

    def near_of(indices: Sequence[int]) -> int:  # a pool on the profile's value counts none
        return min(
            (
                curves[pool][used[j]].samples if draws[pool][used[j]] is not None else 0
                for j in indices
                for pool in POOLS
            ),
            default=0,
        )

    turns = crossings(at, margin)
    # bands where the routing in force has them; where it speculates nowhere (no profile:
    # no class known), where the margin turns up first from a level where surely it loses
    # (97.5% of the replicates): a mixture of experts' band, which a dense model's margin,
    # paying at low load and falling once, does not show
    rises = any(t.direction == "up" for t in turns)
    if rises and (banded or (banded is None and turns[0].direction == "up" and _loses(margins))):
        edges = tuple(_edge(at, t.at, t.direction, margins, near_of) for t in turns)
        # as sure as its least sure edge, and where it still pays at the last level (a band
        # that ends there, a bound), as the samples there and the replicates agreeing on it
        bound = margin[-1] > 0
        ends = [e.near for e in edges] + ([near_of([len(at) - 1])] if bound else [])
        agree = sum(1 for m in margins if m[-1] > 0) / len(margins) if bound else 1.0
        return LiveCrossing(
            found.at, None, None, None, None, tuple(at), min(ends), agree, edges, margin[0] > 0
        )
    if falls_once:  # one crossover: where the margin turns twice, the fall most samples say
        weights = [near_of([j]) for j in range(len(at))]
        found = one_fall(at, margin, weights)
        replicates = [beyond(one_fall(at, m, weights)) for m in margins]
    else:
        replicates = [at_or_beyond(at, m) for m in margins]
    near = near_of(_around(at, found.at if found.at is not None else found.limit))
    if found.at is None:
        side = math.inf if found.bound == "above" else -math.inf
        agree = sum(1 for r in replicates if r == side) / len(replicates)
        return LiveCrossing(None, None, None, found.bound, found.limit, tuple(at), near, agree)
    low, high = snapped(at, *percentile_interval(replicates))
    return LiveCrossing(found.at, low, high, None, None, tuple(at), near)


def one_fall(levels: Sequence[float], margin: Sequence[float], weights: Sequence[int]) -> Crossing:
    """A dense model's one crossover from a margin that may turn more than once (noise, or
    a level's samples taken apart from the other pool's, at another moment of the traffic):
    of every split of the levels into paying below and losing above, the one that the least
    evidence contradicts, each level weighing ``weights`` (its fewest live samples of either
    pool), the lower split on a tie (less speculation); the crossing between the split's two
    levels as ``crossing`` finds it, or a bound when every level is on one side. A margin
    that turns once is ``crossing``'s: a fall as it is, a rise (speculation paying only
    above some load, not a dense model's) speculation nowhere."""
    if len(crossings(levels, margin)) <= 1 or not any(weights):  # one fall, a rise, or
        return crossing(levels, margin)  # no live evidence to weigh: as the finder has it
    best, split = -1, 0
    for k in range(len(levels) + 1):
        agree = sum(w for w, m in zip(weights[:k], margin[:k], strict=True) if m > 0)
        agree += sum(w for w, m in zip(weights[k:], margin[k:], strict=True) if m <= 0)
        if agree > best:
            best, split = agree, k
    if split == 0:
        return Crossing(None, "below", float(levels[0]))
    if split == len(levels):
        return Crossing(None, "above", float(levels[-1]))
    return crossing(levels[split - 1 : split + 1], margin[split - 1 : split + 1])


def _loses(margins: Sequence[Sequence[float]]) -> bool:
    """Whether speculation surely loses at the first level: 97.5% of the replicates say
    so, one side of the 95% interval."""
    losing = sum(1 for m in margins if m[0] < 0)
    return losing >= ONE_SIDED * len(margins)


def _edge(
    levels: Sequence[float],
    at: float,
    direction: str,
    margins: Sequence[Sequence[float]],
    near_of: Callable[[Sequence[int]], int],
) -> LiveEdge:
    """The turn of the medians' margin at ``at`` with its interval: per replicate, its own
    turn of the same direction nearest ``at`` within a level of the two around it, or
    beyond that stretch on the side its margin's sign puts it (an open end)."""
    around = _around(levels, at)
    lo, hi = max(0, around[0] - 1), min(len(levels), around[-1] + 2)
    stretch = levels[lo:hi]
    replicates = []
    for m in margins:
        part = m[lo:hi]
        same = [t.at for t in crossings(stretch, part) if t.direction == direction]
        if same:
            replicates.append(min(same, key=lambda x: abs(math.log(x / at))))
        else:  # no such turn here: paying throughout puts a fall above, a rise below
            paying = sum(1 for v in part if v > 0) * 2 > len(part)
            replicates.append(math.inf if paying == (direction == "down") else -math.inf)
    low, high = snapped(stretch, *percentile_interval(replicates))
    return LiveEdge(at, direction, low, high, near_of(around))


def _around(levels: Sequence[float], at: float | None) -> list[int]:
    """The indices of the levels on each side of ``at`` (the one level it is at, if so)."""
    if at is None:
        return []
    below = [i for i, x in enumerate(levels) if x <= at]
    above = [i for i, x in enumerate(levels) if x >= at]
    return sorted({i for i in (below[-1:] + above[:1])})


def _median(ordered: Sequence[float]) -> float:
    n = len(ordered)
    mid = n // 2
    return ordered[mid] if n % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _median_replicates(ordered: Sequence[float], rng: random.Random) -> list[float]:
    """``REPLICATES`` bootstrap medians of ``ordered``, each by its rank's distribution."""
    n = len(ordered)
    centre, spread = (n - 1) / 2, math.sqrt(n) / 2
    top = n - 1
    return [
        ordered[min(top, max(0, round(centre + rng.gauss(0.0, spread))))] for _ in range(REPLICATES)
    ]
