"""Bootstrap statistics, vectorised with numpy, and the crossover with its interval.

The crossover is the project's one crossing finder (``specroute.crossing``) applied to the
margin of the two curves (the log of their ratio), once for the point estimates and once
per bootstrap replicate. Bootstrap replicates resample each level's requests with
replacement.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from specroute.crossing import crossing

Array = NDArray[np.float64]
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def as_json(
        self, scale: float = 1.0, digits: int = 4, exact: bool = False
    ) -> dict[str, object]:
        """``exact``: the median unrounded, for the curves a crossover is computed from, so
        that a reader computing it again from them finds the same number."""
        low, high = round(self.low * scale, digits), round(self.high * scale, digits)
        median = self.value * scale
        return {"median": median if exact else round(median, digits), "ci": [low, high]}


@dataclass(frozen=True)
class Crossing:
    """Where the margin turns, or a bound when it never does among the levels measured."""

    value: float | None
    low: float | None
    high: float | None
    bound: Literal["above", "below"] | None = None  # "above": spec wins at every level
    limit: float | None = None


def percentile_interval(replicates: Array) -> tuple[float, float]:
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return float(low), float(high)


def median_replicates(samples: Array, rng: np.random.Generator, count: int) -> Array:
    """``count`` bootstrap medians of ``samples``."""
    idx = rng.integers(0, len(samples), size=(count, len(samples)))
    return np.median(samples[idx], axis=1)


def estimate(point: float, replicates: Array) -> Estimate:
    return Estimate(point, *percentile_interval(replicates))


def crossing_with_ci(
    levels: Sequence[float], point: Sequence[float], replicates: Iterable[Sequence[float]]
) -> Crossing:
    """``point``: the margin at each level; ``replicates``: its bootstrap copies. The
    interval comes from the replicates' crossings, each without one counted at the edge of
    the range measured on its side, and always contains the point."""
    found = crossing(levels, point)
    if found.at is None:
        return Crossing(None, None, None, found.bound, found.limit)
    low, high = percentile_interval(np.array([_at_or_edge(levels, m) for m in replicates]))
    return Crossing(found.at, min(low, found.at), max(high, found.at))


def _at_or_edge(levels: Sequence[float], margin: Sequence[float]) -> float:
    found = crossing(levels, margin)
    if found.at is not None:
        return found.at
    return float(levels[-1] if found.bound == "above" else levels[0])
