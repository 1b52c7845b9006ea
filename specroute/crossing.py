"""Where one curve stops beating another: the project's one crossing finder.

Every number called a crossover (the profile's, the predictor's, a policy's threshold and so
``specroute_crossover``) and the capacity benchmark's lag limit come from ``crossing``, by
one rule: between two measured levels the margin is linear in log concurrency.

Why that rule: levels are spaced geometrically (1, 2, 4, ...), so log concurrency spaces
them evenly and no segment dominates by its width; and for two curves the margin is the log
of their ratio (``log_margin``), which is linear in log concurrency wherever both curves are
power laws between levels (how a profile's curves are interpolated), and is the same number
whether the curves are times (TPOT) or rates (tok/s), so the crossover of a time and of its
reciprocal agree. Pure Python: the router imports it, and it must not load numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Literal


@dataclass(frozen=True)
class Crossing:
    """Where the margin first falls from positive to zero or below; when it never does
    among the levels, ``at`` is None and ``bound`` says on which side of them it lies:
    ``"above"`` (positive at every level, so above ``limit``, the last one) or ``"below"``
    (not positive even at ``limit``, the first one)."""

    at: float | None
    bound: Literal["above", "below"] | None = None
    limit: float | None = None


def log_margin(ours: Sequence[float], theirs: Sequence[float]) -> list[float]:
    """log(theirs / ours) per level, for measures where lower is better (times): positive
    while ``ours`` is lower. For rates, pass them the other way round."""
    return [math.log(b / a) for a, b in zip(ours, theirs, strict=True)]


def crossing(levels: Sequence[float], margin: Sequence[float]) -> Crossing:
    """The first crossing of ``margin`` (one value per level, levels ascending and > 0).
    Never past the levels: what was not measured is a bound, not a guess."""
    if len(levels) != len(margin) or not levels:
        raise ValueError("crossing needs one margin per level, and at least one level")
    if margin[0] <= 0:
        return Crossing(None, "below", float(levels[0]))
    for (x0, m0), (x1, m1) in pairwise(zip(levels, margin, strict=True)):
        if m1 <= 0:
            return Crossing(_between(x0, m0, x1, m1))
    return Crossing(None, "above", float(levels[-1]))


@dataclass(frozen=True)
class SignChange:
    """One sign change of the margin: ``"down"`` where speculation stops paying going up in
    load (positive, then zero or below), ``"up"`` where it starts paying again."""

    at: float
    direction: Literal["down", "up"]


def crossings(levels: Sequence[float], margin: Sequence[float]) -> list[SignChange]:
    """Every sign change of ``margin``, in order of load, by the same rule as ``crossing``
    (whose crossing is the first ``"down"`` one, when the margin starts positive)."""
    if len(levels) != len(margin) or not levels:
        raise ValueError("crossings needs one margin per level, and at least one level")
    changes = []
    for (x0, m0), (x1, m1) in pairwise(zip(levels, margin, strict=True)):
        if m0 > 0 >= m1:
            changes.append(SignChange(_between(x0, m0, x1, m1), "down"))
        elif m0 <= 0 < m1:
            changes.append(SignChange(_between(x0, m0, x1, m1), "up"))
    return changes


Band = tuple[float | None, float | None]  # loads where speculation pays: (from, to), None open


def bands(levels: Sequence[float], margin: Sequence[float]) -> list[Band]:
    """The loads where the margin is positive, by the same rule as ``crossings``: each band
    runs from an ``"up"`` turn to the next ``"down"`` one; open below (from the lowest load)
    when the first level pays; closed at the last level when it pays there, as a crossover
    that was never found is (nothing was measured past it). A single crossover is the one
    band ``(None, crossover)``."""
    turns = [(t.at, t.direction) for t in crossings(levels, margin)]
    return between(turns, bool(margin) and margin[0] > 0, float(levels[-1]))


def between(turns: Sequence[tuple[float, str]], paid_first: bool, last: float) -> list[Band]:
    """The bands between ``turns`` (load and direction, in order of load): open below when
    speculation ``paid_first`` at the lowest load; closed at ``last`` when it still pays."""
    found: list[Band] = []
    start: float | None = None
    paying = paid_first
    for at, direction in turns:
        if direction == "up":
            start, paying = at, True
        else:
            found.append((start, at))
            paying = False
    if paying:
        found.append((start, last))
    return found


def first_top(bands: Sequence[Band]) -> float:
    """The first band's top: where speculation first stops paying, going up in load (0
    with no band: it never pays)."""
    if not bands:
        return 0.0
    top = bands[0][1]
    return math.inf if top is None else top


def _between(x0: float, m0: float, x1: float, m1: float) -> float:
    """Where the line through (log x0, m0) and (log x1, m1) reaches 0."""
    return float(x0 * (x1 / x0) ** (m0 / (m0 - m1)))


# The interval of a crossing, from its bootstrap replicates: the profile's rule and the live
# estimate's alike (``profiler.stats`` for calibration, ``router.online_fit`` while serving).

CONFIDENCE = 0.95
ONE_SIDED = CONFIDENCE + (1 - CONFIDENCE) / 2  # of replicates, past one end of the interval


def at_or_beyond(levels: Sequence[float], margin: Sequence[float]) -> float:
    """The crossing of ``margin``, or -inf / +inf when it lies below / above the levels."""
    return beyond(crossing(levels, margin))


def beyond(found: Crossing) -> float:
    """A crossing as a number: -inf / +inf when it lies below / above the levels."""
    if found.at is not None:
        return found.at
    return math.inf if found.bound == "above" else -math.inf


def percentile(ordered: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) of values in ascending order, interpolated linearly
    between the two nearest ranks (numpy's default rule)."""
    rank = q / 100 * (len(ordered) - 1)
    below = math.floor(rank)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (ordered[above] - ordered[below]) * (rank - below)


def percentile_interval(replicates: Sequence[float]) -> tuple[float, float]:
    """The central ``CONFIDENCE`` interval; infinite replicates (beyond what was measured)
    give an infinite end once they reach into that end's tail."""
    tail = (1 - CONFIDENCE) / 2 * 100
    finite = [x for x in replicates if math.isfinite(x)]
    if not finite:
        return float(min(replicates)), float(max(replicates))
    lo, hi = min(finite), max(finite)
    spread = max(hi - lo, abs(hi), 1.0) * 4  # stands in for the infinities
    stand_in = sorted(min(max(x, lo - spread), hi + spread) for x in replicates)
    low, high = percentile(stand_in, tail), percentile(stand_in, 100 - tail)
    return (low if low >= lo else -math.inf), (high if high <= hi else math.inf)


def snapped(levels: Sequence[float], low: float, high: float) -> tuple[float | None, float | None]:
    """Each end of an interval out to the level measured past it (the margin may bend
    between levels); an infinite end is open (None)."""
    low = max((lvl for lvl in levels if lvl <= low), default=low)
    high = min((lvl for lvl in levels if lvl >= high), default=high)
    return (
        float(low) if math.isfinite(low) else None,
        float(high) if math.isfinite(high) else None,
    )
