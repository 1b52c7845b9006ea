"""Bootstrap statistics, vectorised with numpy, and the crossover with its interval.

Resampling follows how the data was made: the requests of one closed-loop run share their
batches, so a level's statistic varies between runs by more than its requests alone say.
Each replicate has two stages (hierarchical data: Davison and Hinkley 1997, *Bootstrap
Methods and their Application*, section 3.8; Field and Welsh 2007, "Bootstrapping clustered
data", JRSS B 69(3)). Within each run, its requests are drawn with replacement. Between
runs, the replicate is shifted by the uncertainty of a mean of the runs' own values: the
log of each run's statistic, their standard deviation ``s`` over ``n`` runs, and a shift of
``s / sqrt(n)`` times a draw of Student's t with ``n - 1`` degrees of freedom (Student
1908), so that the interval of a level measured three times is the t interval of three
runs. Resampling three runs instead cannot reach past the most extreme of them, and the
true level lies outside three normal draws' range one time in four. The run stage is
parametric (run effects normal on the log scale, as ``--noise`` makes them); the request
stage counts the within-run spread a second time on top of the runs' spread, which errs
wide. One run has no between-run spread to measure, and gets none.

The crossover is the project's one crossing finder (``specroute.crossing``) applied to the
margin of the two curves (the log of their ratio), once for the point estimates and once
per bootstrap replicate. A replicate with no crossing among the levels counts as beyond
them on its side, never at their edge: when more than the tail of the replicates lie
beyond, that end of the interval is open ("at least", "at most").

Between two levels measured, where a replicate's margin changes sign, the crossing finder
interpolates on a straight line; the curve may bend there (a batch-size table's knee, the
CUDA-graph limit), and nothing measured says how. So each closed end of the interval goes
out to the level measured past it: the interval says where the crossover can be given
what was measured, and the search narrows it by measuring inside.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import NDArray

from specroute.crossing import Band, SignChange, at_or_beyond, bands, crossing, crossings, snapped
from specroute.crossing import percentile_interval as core_interval

Array = NDArray[np.float64]


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
class Edge:
    """One sign change of the margin with its interval: the percentile interval of the
    replicates' own turns of the same direction near it (nearer it than any other turn of
    that direction), each end out to the level measured past it; ``support`` is the share
    of replicates that have such a turn (a band whose edges few replicates share may not
    be there)."""

    at: float
    direction: Literal["down", "up"]
    low: float
    high: float
    support: float


@dataclass(frozen=True)
class Crossing:
    """Where the margin turns, or a bound when it never does among the levels measured.

    ``low`` or ``high`` is None when that end of the interval is open: more than its tail
    of the replicates found no crossing on that side of the levels measured. ``beyond``
    gives the share of replicates without a crossing on each side; ``turns`` every sign
    change of the point estimates' margin (``value`` is the first ``"down"`` one), with its
    interval; ``bands`` the loads where speculation pays (``crossing.bands``)."""

    value: float | None
    low: float | None
    high: float | None
    bound: Literal["above", "below"] | None = None  # "above": spec wins at every level
    limit: float | None = None
    beyond: tuple[float, float] = (0.0, 0.0)  # replicates: (below the levels, above them)
    turns: tuple[Edge, ...] = ()
    bands: tuple[Band, ...] = ()

    @property
    def open_side(self) -> Literal["above", "below", "both"] | None:
        if self.value is None:
            return None
        if self.low is None and self.high is None:
            return "both"
        return "above" if self.high is None else "below" if self.low is None else None


def percentile_interval(replicates: Array) -> tuple[float, float]:
    """The central ``CONFIDENCE`` interval, by the crossing finder's rule
    (``specroute.crossing.percentile_interval``)."""
    return core_interval([float(x) for x in np.ravel(replicates)])


def within_runs(
    runs: Sequence[int], rng: np.random.Generator, count: int
) -> tuple[NDArray[np.intp], NDArray[np.bool_]]:
    """Indices into the requests of runs of sizes ``runs`` (stored one run after another)
    for ``count`` replicates, each run's requests drawn with replacement from that run.
    Returns ``(index, valid)`` of shape ``(count, slots)``; a run smaller than the largest
    fills its slots only where ``valid``."""
    sizes = np.asarray(runs, dtype=np.intp)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    widest = int(sizes.max())
    n, start = sizes[:, None], offsets[:, None]
    index = start + np.floor(rng.random((count, len(sizes), widest)) * n).astype(np.intp)
    valid = np.broadcast_to(np.arange(widest) < n, index.shape)
    return index.reshape(count, -1), valid.reshape(count, -1)


def run_draws(runs: int, rng: np.random.Generator, count: int) -> Array:
    """Student's t with ``runs - 1`` degrees of freedom, one per replicate, shared by a
    cell's statistics (a run's luck moves all of them); zeros for one run."""
    if runs < 2:
        return np.zeros(count)
    return rng.standard_t(runs - 1, count)


def between_runs(per_run: Array, t: Array) -> Array:
    """Multipliers of a statistic's replicates for the spread of its runs' own values
    ``per_run`` (positive): ``exp(t * s / sqrt(n))``, ``s`` the standard deviation of
    their logs, the exponent held within +-20 (a t with one degree of freedom reaches far
    beyond any crossing, and past that only overflow would change)."""
    if len(per_run) < 2:
        return np.ones_like(t)
    spread = float(np.std(np.log(per_run), ddof=1)) / math.sqrt(len(per_run))
    return np.exp(np.clip(t * spread, -20.0, 20.0))


def resampled(
    samples: Array,
    draws: tuple[NDArray[np.intp], NDArray[np.bool_]],
    stat: Callable[..., Array],
) -> Array:
    """``stat`` (``np.median`` or ``np.mean``; its nan-ignoring twin when runs differ in
    size) of ``samples`` over each replicate's draws."""
    index, valid = draws
    values = samples[index]
    if valid.all():
        return np.asarray(stat(values, axis=1))
    padded = np.where(valid, values, np.nan)
    if stat is np.median:
        return np.asarray(np.nanmedian(padded, axis=1))
    return np.asarray(np.nanmean(padded, axis=1))


def estimate(point: float, replicates: Array) -> Estimate:
    return Estimate(point, *percentile_interval(replicates))


def crossing_with_ci(
    levels: Sequence[float], point: Sequence[float], replicates: Iterable[Sequence[float]]
) -> Crossing:
    """``point``: the margin at each level; ``replicates``: its bootstrap copies. The
    interval is the percentile interval of the replicates' crossings, a replicate without
    one counting as below or above every level (see the module's docstring); it need not
    contain the point."""
    found = crossing(levels, point)
    margins = [list(m) for m in replicates]
    turns = _edges(levels, crossings(levels, point), [crossings(levels, m) for m in margins])
    paying = tuple(bands(levels, point))
    at = np.array([at_or_beyond(levels, m) for m in margins], dtype=float)
    if not len(at):
        at = np.array([at_or_beyond(levels, point)])
    beyond = (float(np.mean(at == -math.inf)), float(np.mean(at == math.inf)))
    if found.at is None:
        return Crossing(None, None, None, found.bound, found.limit, beyond, turns, paying)
    low, high = snapped(levels, *percentile_interval(at))
    return Crossing(found.at, low, high, beyond=beyond, turns=turns, bands=paying)


def _edges(
    levels: Sequence[float], point: list[SignChange], replicates: list[list[SignChange]]
) -> tuple[Edge, ...]:
    """Each of the point estimates' turns with the interval of the replicates' matching
    turns: of the same direction, in its share of the load axis (up to the geometric
    middle between it and the next turn of that direction), the nearest in log load."""
    edges = []
    for turn in point:
        same = [t.at for t in point if t.direction == turn.direction]
        i = same.index(turn.at)
        lo = math.sqrt(same[i - 1] * turn.at) if i > 0 else 0.0
        hi = math.sqrt(same[i + 1] * turn.at) if i + 1 < len(same) else math.inf
        matched = [
            min(near, key=lambda x: abs(math.log(x / turn.at)))
            for rep in replicates
            if (near := [t.at for t in rep if t.direction == turn.direction and lo < t.at <= hi])
        ]
        found = np.array(matched or [turn.at])
        low, high = snapped(levels, *percentile_interval(found))
        edges.append(
            Edge(
                turn.at,
                turn.direction,
                low if low is not None else levels[0],
                high if high is not None else levels[-1],
                len(matched) / max(1, len(replicates)),
            )
        )
    return tuple(edges)
