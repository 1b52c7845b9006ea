"""Bootstrap statistics and the crossing of two curves, vectorised with numpy.

A crossing is where speculation's relative advantage ``spec / base - 1`` (on a measure where
lower is better) turns from negative to non-negative, interpolated linearly between the two
levels around it. Bootstrap replicates resample each level's requests with replacement.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

Array = NDArray[np.float64]
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float

    def as_json(self, scale: float = 1.0, digits: int = 4) -> dict[str, object]:
        low, high = round(self.low * scale, digits), round(self.high * scale, digits)
        return {"median": round(self.value * scale, digits), "ci": [low, high]}


@dataclass(frozen=True)
class Crossing:
    """Where the advantage turns, or a bound when it never does among the levels measured."""

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


def crossing(levels: Sequence[float], advantage: Array) -> float:
    """First level where ``advantage`` (rows: levels) turns >= 0 after being < 0; inf when it
    stays < 0, 0 when it is >= 0 from the first level. Works on one curve (1-D)."""
    for i in range(len(levels)):
        if advantage[i] >= 0:
            if i == 0:
                return 0.0
            a, b = advantage[i - 1], advantage[i]
            return float(levels[i - 1] + (levels[i] - levels[i - 1]) * (-a) / (b - a))
    return float("inf")


def crossing_with_ci(levels: Sequence[float], point: Array, replicates: Array) -> Crossing:
    """``point``: the advantage at each level; ``replicates``: bootstrap copies, shape
    (count, levels). The interval comes from the replicates' crossings, clamped to the
    range measured."""
    value = crossing(levels, point)
    lowest, highest = float(levels[0]), float(levels[-1])
    if value == float("inf"):
        return Crossing(None, None, None, "above", highest)
    if value == 0.0:
        return Crossing(None, None, None, "below", lowest)
    found = np.array([crossing(levels, row) for row in replicates], dtype=float)
    found = np.clip(found, lowest, highest)
    low, high = percentile_interval(found)
    return Crossing(value, min(low, value), max(high, value))
