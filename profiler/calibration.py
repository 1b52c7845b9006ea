"""``specroute calibrate``: sweep and profile in one go, spending backend time where it
narrows the crossover.

A coarse grid (powers of two, one run per backend) goes up until speculation has clearly
lost at a level, which brackets the crossover. The rest of the budget goes to levels inside
the bracket, each halving it and each run ``repeats`` times, until both the crossover's
interval and the bracket are narrow enough, the bracket is one request wide, or the budget
is spent. The cost is reported beside an estimate of what a uniform grid as fine near the
crossover, over the whole range, would have cost.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specroute.bench.progress import Progress
from specroute.bench.sweep import BACKENDS, Sweep, SweepPlan
from specroute.profiler.analysis import Analysis, analyse
from specroute.profiler.sweep_data import SweepData, load_sweep


@dataclass(frozen=True)
class CalibrationPlan:
    sweep: SweepPlan
    max_concurrency: int = 64
    budget_seconds: float = 15 * 60
    precision: float = 0.3  # stop when (high - low) / value is at most this


@dataclass(frozen=True)
class Calibration:
    analysis: Analysis
    levels: list[int]  # in the order measured
    backend_seconds: float
    grid_levels: int
    grid_seconds: float
    stopped: str

    def as_json(self) -> dict[str, Any]:
        return {
            "levels_measured": self.levels,
            "backend_seconds": round(self.backend_seconds, 1),
            "uniform_grid_levels": self.grid_levels,
            "uniform_grid_backend_seconds": round(self.grid_seconds, 1),
            "stopped": self.stopped,
        }


def coarse_levels(max_concurrency: int) -> list[int]:
    levels = [2**i for i in range(int(math.log2(max_concurrency)) + 1)]
    return levels if levels[-1] == max_concurrency else [*levels, max_concurrency]


def _spec_surely_lost(analysis: Analysis, level: int) -> bool:
    """Speculation's median TPOT is worse than the plain server's whole interval."""
    cells = analysis.cells
    return cells[("spec", level)].tpot.value > cells[("base", level)].tpot.high


def _bracket(value: float, measured: Collection[int]) -> tuple[int | None, int | None]:
    """The measured levels around ``value``: the highest at or below it, the lowest above."""
    below = max((lvl for lvl in measured if lvl <= value), default=None)
    above = min((lvl for lvl in measured if lvl > value), default=None)
    return below, above


def _next_level(analysis: Analysis, measured: set[int]) -> int | None:
    """The unmeasured level nearest the middle of the bracket around the crossover."""
    value = analysis.tpot_crossover.value
    if value is None:
        return None
    below, above = _bracket(value, measured)
    if below is None or above is None or above - below <= 1:
        return None
    return round(math.sqrt(below * above)) if above > 2 * below else (below + above) // 2


def _grid_cost(
    data: SweepData, measured: list[int], spacing: int, highest: int
) -> tuple[int, float]:
    """A uniform grid from 1 to ``highest``, ``spacing`` apart, at the per-level cost
    measured here (interpolated in log concurrency; past the highest level measured, in
    proportion to the level, as the requests per level are)."""
    levels = sorted(measured)
    costs = [sum(data.cells[(b, lvl)].seconds for b in BACKENDS) for lvl in levels]
    grid = np.arange(1, highest + 1, max(1, spacing), dtype=float)
    seconds = np.interp(np.log(grid), np.log(levels), costs)
    beyond = grid > levels[-1]
    seconds[beyond] = costs[-1] * grid[beyond] / levels[-1]
    return len(grid), float(seconds.sum())


def _why_stop(analysis: Analysis, measured: list[int], precision: float) -> str | None:
    crossover = analysis.tpot_crossover
    if crossover.value is None:
        side = "wins" if crossover.bound == "above" else "loses"
        return f"no crossover to refine: speculation {side} at every level measured"
    assert crossover.low is not None and crossover.high is not None
    below, above = _bracket(crossover.value, measured)
    assert below is not None  # a crossover lies at or above the first level measured
    width = 0 if above is None else above - below
    narrow = max(crossover.high - crossover.low, width) <= precision * crossover.value
    if narrow:  # the bracket too: interpolating across a wide one can miss a bent curve
        return f"interval and bracket within {precision:.0%} of the crossover"
    return None


async def calibrate(plan: CalibrationPlan, out: Path) -> Calibration:
    coarse = coarse_levels(plan.max_concurrency)
    progress = Progress(len(coarse) * len(BACKENDS))
    deadline = time.monotonic() + plan.budget_seconds
    measured: list[int] = []
    async with Sweep(plan.sweep, out, progress) as sweep:
        for level in coarse:
            await sweep.measure(level, repeats=1)
            measured.append(level)
            analysis = analyse(load_sweep(out))
            if _spec_surely_lost(analysis, level):
                break  # the crossover is bracketed; higher levels cost most and say least
            if time.monotonic() > deadline:
                break
        while (stopped := _why_stop(analysis, measured, plan.precision)) is None:
            inside = _next_level(analysis, set(measured))
            if inside is None:
                stopped = "the bracket is one request wide"
                break
            last = sum(analysis.data.cells[(b, measured[-1])].seconds for b in BACKENDS)
            if time.monotonic() + last > deadline:
                stopped = "the budget is spent"
                break
            progress.total += plan.sweep.repeats * len(BACKENDS)
            await sweep.measure(inside)
            measured.append(inside)
            analysis = analyse(load_sweep(out))
    data = load_sweep(out)  # again: closing the sweep wrote its end time and cost
    analysis = analyse(data)
    spacing = _final_spacing(analysis, measured)
    grid_levels, grid_seconds = _grid_cost(data, measured, spacing, plan.max_concurrency)
    return Calibration(
        analysis, measured, sweep.backend_seconds, grid_levels, grid_seconds, stopped
    )


def _final_spacing(analysis: Analysis, measured: list[int]) -> int:
    """The finest step between levels measured near the crossover (within a factor of two),
    which a uniform grid would need everywhere to resolve it as well."""
    ordered = sorted(set(measured))
    value = analysis.tpot_crossover.value or analysis.tpot_crossover.limit or ordered[-1]
    near = [lvl for lvl in ordered if value / 2 <= lvl <= value * 2]
    return min((b - a for a, b in itertools.pairwise(near)), default=1)
