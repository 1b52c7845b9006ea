"""``specroute calibrate``: sweep and profile in one go, spending backend time where it
narrows the crossover.

The search doubles the concurrency from 1, one run per backend and level: there is no
fixed top, only the user's ``max_concurrency`` (a hard ceiling), the servers' largest
batch and the budget. It goes on while no band of paying load has been found (a
mixture-of-experts model can lose at low load and win at medium), while speculation pays at
the highest level measured, while the margin rose from the level below the highest (it may
cross again), or while the crossover's interval is open above with its bracket at the top.
No crossing is believed on one run: the levels around each are measured until each has
``near`` runs (at least 3; the middle between them first, when the level above had one
run and lies more than a request away), and the search goes on if the crossing goes away;
a loss everywhere is believed once the lowest and highest levels have ``near`` runs. The
rest of the budget goes to levels inside each crossing's interval in turn, from the lowest
load, each with ``near`` runs: the middle of the bracket around the crossing, then of the
widest gap left inside the interval (whose ends reach to the levels measured past them),
until the interval is within ``precision`` of the crossing, the levels inside it are one
request apart, a level measured inside has not narrowed it (the runs' spread, not the
spacing of levels, sets its width), or the budget is spent. The budget counts backend time
(the runs themselves), so a virtual-time sweep spends it alike.
The cost is reported beside an estimate of what a uniform grid as fine near the
crossover, over the whole range, would have cost, when a crossing was measured.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specroute.loadgen.progress import Progress
from specroute.loadgen.sweep import BACKENDS, Sweep, SweepPlan
from specroute.profiler.analysis import Analysis, analyse
from specroute.profiler.stats import Edge
from specroute.profiler.sweep_data import SweepData, load_sweep

MIN_RUNS_NEAR = 3  # runs per backend at the levels around the crossover, at least


@dataclass(frozen=True)
class CalibrationPlan:
    sweep: SweepPlan
    max_concurrency: int | None = None  # a hard ceiling; None: the servers' largest batch
    budget_seconds: float = 15 * 60  # of backend time
    precision: float = 0.3  # stop when (high - low) / value is at most this

    @property
    def near(self) -> int:
        """Runs per backend at the levels around the crossover."""
        return max(MIN_RUNS_NEAR, self.sweep.repeats)


@dataclass(frozen=True)
class Calibration:
    analysis: Analysis
    levels: list[int]  # in the order first measured
    runs: dict[int, int]  # level: runs per backend
    backend_seconds: float
    grid_levels: int | None  # None: no crossing measured, so no grid to compare with
    grid_seconds: float | None
    stopped: str

    def as_json(self) -> dict[str, Any]:
        return {
            "levels_measured": self.levels,
            "runs_per_level": {str(lvl): n for lvl, n in sorted(self.runs.items())},
            "backend_seconds": round(self.backend_seconds, 1),
            "uniform_grid_levels": self.grid_levels,
            "uniform_grid_backend_seconds": None
            if self.grid_seconds is None
            else round(self.grid_seconds, 1),
            "stopped": self.stopped,
        }


class _BudgetSpent(Exception):
    """The next measurement would overrun the budget."""


def _bracket(value: float, measured: Collection[int]) -> tuple[int | None, int | None]:
    """The measured levels around ``value``: the highest at or below it, the lowest above."""
    below = max((lvl for lvl in measured if lvl <= value), default=None)
    above = min((lvl for lvl in measured if lvl > value), default=None)
    return below, above


def _next_level(edge: Edge, measured: Collection[int]) -> int | None:
    """An unmeasured level inside an edge's interval: the middle of the bracket around it
    if that is wider than one request, else of the widest gap between levels measured
    inside the interval (the interval reaches to the levels measured past its ends, so a
    gap there is what keeps it wide)."""
    below, above = _bracket(edge.at, measured)
    if below is not None and above is not None and above - below > 1:
        return _middle(below, above)
    inside = sorted(lvl for lvl in measured if edge.low <= lvl <= edge.high)
    gaps = [(b / a, a, b) for a, b in itertools.pairwise(inside) if b - a > 1]
    if not gaps:
        return None
    _, a, b = max(gaps)
    return _middle(a, b)


def _middle(a: int, b: int) -> int:
    return round(math.sqrt(a * b)) if b > 2 * a else (a + b) // 2


def _grid_cost(
    data: SweepData, measured: list[int], spacing: int, highest: int
) -> tuple[int, float]:
    """A uniform grid from 1 to ``highest``, ``spacing`` apart, at the per-run cost measured
    here times the most runs any level had (interpolated in log concurrency; past the
    highest level measured, in proportion to the level, as the requests per level are)."""
    levels = sorted(measured)
    runs = max(data.cells[("spec", lvl)].runs for lvl in levels)
    costs = [
        sum(data.cells[(b, lvl)].seconds / max(1, data.cells[(b, lvl)].runs) for b in BACKENDS)
        * runs
        for lvl in levels
    ]
    grid = np.arange(1, highest + 1, max(1, spacing), dtype=float)
    seconds = np.interp(np.log(grid), np.log(levels), costs)
    beyond = grid > levels[-1]
    seconds[beyond] = costs[-1] * grid[beyond] / levels[-1]
    return len(grid), float(seconds.sum())


def _narrow(edge: Edge, precision: float) -> bool:
    return edge.high - edge.low <= precision * edge.at


def _server_ceiling(meta: dict[str, Any]) -> int | None:
    """The smaller of the two servers' largest batches, when both say: past it a closed
    loop only queues."""
    caps = [
        (meta.get(b, {}).get("server_info") or {}).get("max_running_requests") for b in BACKENDS
    ]
    known = [int(c) for c in caps if isinstance(c, int) and c > 0]
    return min(known) if len(known) == len(caps) else None


class _Search:
    def __init__(self, plan: CalibrationPlan, sweep: Sweep, out: Path, start: int = 1) -> None:
        self.plan, self.sweep, self.out, self.start = plan, sweep, out, start
        self.order: list[int] = []
        self.ceiling = plan.max_concurrency
        self.analysis: Analysis | None = None

    @property
    def runs(self) -> dict[int, int]:
        return dict(self.sweep.repeats)

    def _cost(self, level: int, runs: int) -> float:
        """Backend time ``runs`` more runs of ``level`` should take: the nearest level
        measured below, per run, in proportion to the level when it is higher."""
        data = self.analysis.data if self.analysis is not None else None
        known = sorted(self.runs)
        if data is None or not known:
            return 0.0
        near = max((lvl for lvl in known if lvl <= level), default=known[0])
        per_run = sum(
            data.cells[(b, near)].seconds / max(1, data.cells[(b, near)].runs) for b in BACKENDS
        )
        return per_run * runs * max(1.0, level / near)

    async def measure(self, level: int, runs: int) -> Analysis:
        spent = self.sweep.backend_seconds
        if spent > 0 and spent + self._cost(level, runs) > self.plan.budget_seconds:
            raise _BudgetSpent
        if self.sweep.progress is not None:
            self.sweep.progress.total += runs * len(BACKENDS)
        await self.sweep.measure(level, runs)
        if level not in self.order:
            self.order.append(level)
        self.analysis = analyse(load_sweep(self.out))
        return self.analysis

    async def top_up(self, levels: Collection[int]) -> bool:
        """Measure each of ``levels`` again until it has ``near`` runs; False if none
        needed it."""
        short = sorted(lvl for lvl in set(levels) if self.runs.get(lvl, 0) < self.plan.near)
        for level in short:
            await self.measure(level, self.plan.near - self.runs.get(level, 0))
        return bool(short)

    async def settle(self, value: float) -> bool:
        """What the bracket around a crossing at ``value`` needs before it is believed: the
        level below to ``near`` runs; then, while the level above had fewer and the bracket
        is wider than ``precision`` of the crossing, its middle, one run (halving it where
        runs are cheap: a level that stops bracketing costs one run, not ``near``); then the
        level above to ``near`` runs. False when the bracket needs nothing more."""
        below, above = _bracket(value, self.runs)
        if below is not None and await self.top_up([below]):
            return True
        if below is None or above is None:
            return False
        wide = above - below > max(1.0, self.plan.precision * value)
        if self.runs[above] < self.plan.near and wide:
            await self.measure(_middle(below, above), 1)
            return True
        return await self.top_up([above])

    async def settle_edges(self) -> bool:
        """``settle`` every crossing found, in order of load; False when none needs more."""
        assert self.analysis is not None
        for edge in self.analysis.tpot_crossover.turns:
            if await self.settle(edge.at):
                return True
        return False

    async def top_up_inside(self) -> bool:
        """Every level inside each crossing's interval to ``near`` runs: a level of one run
        shows no spread between runs, and would narrow the interval it lies in."""
        assert self.analysis is not None
        crossover = self.analysis.tpot_crossover
        inside = {lvl for e in crossover.turns for lvl in self.runs if e.low <= lvl <= e.high}
        if crossover.value is not None and crossover.high is None:  # open above
            inside |= {lvl for lvl in self.runs if lvl >= (crossover.low or 0)}
        return await self.top_up(inside)

    def scan_on(self) -> bool:
        """Whether doubling goes on: no band of paying load found yet (one may lie higher:
        a mixture-of-experts model loses at low load and wins at medium), speculation pays
        at the highest level measured, its margin rose from the level below it (it may cross
        again), or the crossover's interval is open above with its bracket at the top."""
        analysis = self.analysis
        assert analysis is not None
        margin, crossover = analysis.tpot_margin, analysis.tpot_crossover
        if not crossover.bands or margin[-1] > 0:
            return True
        if len(margin) > 1 and margin[-1] > margin[-2]:
            return True
        above = _bracket(crossover.value, self.runs)[1] if crossover.value is not None else None
        return crossover.high is None and above == max(self.runs)

    async def find(self) -> str | None:
        """Double while ``scan_on``, each crossing found settled with ``near`` runs on both
        sides; a reason to stop when the search ends without a crossing to refine."""
        if self.ceiling is None:
            self.ceiling = _server_ceiling(self.sweep.meta)
        await self.measure(1, 1)
        if self.start > 1:
            await self.measure(self.start, 1)
        while True:
            if await self.settle_edges():
                continue  # a crossing may move or go away
            analysis = self.analysis
            assert analysis is not None
            crossover, top = analysis.tpot_crossover, max(self.runs)
            if not crossover.bands and await self.top_up([min(self.runs), top]):
                continue  # a loss everywhere is believed on more than one run
            at_ceiling = self.ceiling is not None and top >= self.ceiling
            if not self.scan_on() or at_ceiling:
                break
            higher = top * 2 if self.ceiling is None else min(top * 2, self.ceiling)
            await self.measure(higher, 1)
        if not crossover.bands:
            return (
                f"speculation paid at no level from {min(self.runs)} to {top} "
                f"({self.runs[top]} runs at {top})"
            )
        if not crossover.turns:
            return (
                f"speculation still paid at {top}, the ceiling (--max-concurrency, or "
                "the servers' max running requests)"
            )
        if at_ceiling and crossover.value is not None and crossover.high is None:
            return f"the interval stays open above {top}, the ceiling"
        return None

    def paying_at_top(self) -> bool:
        """Speculation pays at the highest level measured, below the ceiling."""
        assert self.analysis is not None
        top = max(self.runs)
        below_ceiling = self.ceiling is None or top < self.ceiling
        return below_ceiling and self.analysis.tpot_margin[-1] > 0

    async def refine(self) -> str | None:
        """Measure inside the crossings' intervals, each in turn from the lowest load, until
        each is within ``precision`` of its crossing, its levels one request apart, or a
        level measured inside it did not narrow it; None when the highest level, measured
        again, pays after all (the search doubles on)."""
        narrowest: dict[int, float] = {}  # per crossing (its place in load order): its width
        done: dict[int, str] = {}  # when a level was last measured inside it; why it is done
        while True:
            if await self.settle_edges():
                continue
            if self.paying_at_top():
                return None  # measured again, the highest level pays: search further up
            assert self.analysis is not None
            edges = self.analysis.tpot_crossover.turns
            if not edges:
                return "the crossings went away when the levels around them were measured again"
            target = None
            for i, edge in enumerate(edges):
                width, level = edge.high - edge.low, _next_level(edge, self.runs)
                if i in done:
                    continue
                if _narrow(edge, self.plan.precision):
                    done[i] = f"interval within {self.plan.precision:.0%}"
                elif width >= narrowest.get(i, math.inf):
                    done[i] = "a level measured inside did not narrow it"
                elif level is None:
                    done[i] = "levels inside one request apart"
                else:
                    target = i, level, width
                    break
            if target is not None:
                i, level, narrowest[i] = target
                await self.measure(level, self.plan.near)
            elif not await self.top_up_inside():  # the intervals may move
                return _stop_reason(edges, done)


def _stop_reason(edges: tuple[Edge, ...], done: dict[int, str]) -> str:
    """Why refining ended, per crossing; where it was not precision, the runs' spread sets
    the width (more runs per level would narrow it)."""
    said = "; ".join(
        f"{e.direction} at {e.at:.1f}: {done.get(i, 'settled')}" for i, e in enumerate(edges)
    )
    if all(why.startswith("interval within") for why in done.values()):
        return said
    return said + " (the runs' spread sets the width: more runs per level would narrow it)"


async def calibrate(
    plan: CalibrationPlan, out: Path, sweep: Sweep | None = None, start: int = 1
) -> Calibration:
    """``sweep``: where the runs come from (by default HTTP to the plan's servers);
    ``start``: where doubling starts, after level 1 (``start_level``)."""
    sweep = sweep if sweep is not None else Sweep(plan.sweep, out, Progress(0))
    if plan.max_concurrency is not None:
        start = min(start, plan.max_concurrency)
    search = _Search(plan, sweep, out, start)
    async with sweep:
        try:
            stopped = None
            while stopped is None:  # refining may find speculation paying at the top again
                stopped = await search.find() or await search.refine()
        except _BudgetSpent:
            highest = max(search.runs)
            found = search.analysis.tpot_crossover if search.analysis else None
            stopped = f"the budget is spent (highest level measured {highest})" + (
                ""
                if found is not None and found.value is not None
                else ", before speculation stopped paying"
            )
    data = load_sweep(out)  # again: closing the sweep wrote its end time and cost
    analysis = analyse(data)
    measured = search.order
    grid_levels: int | None = None
    grid_seconds: float | None = None
    if analysis.tpot_crossover.turns:  # a grid as fine near no crossing means nothing
        spacing = _final_spacing(analysis, measured)
        grid_levels, grid_seconds = _grid_cost(data, measured, spacing, max(measured))
    return Calibration(
        analysis,
        measured,
        search.runs,
        sweep.backend_seconds,
        grid_levels,
        grid_seconds,
        stopped,
    )


def _final_spacing(analysis: Analysis, measured: list[int]) -> int:
    """The finest step between levels measured near a crossing (within a factor of two of
    it), which a uniform grid would need everywhere to resolve it as well."""
    ordered = sorted(set(measured))
    crossover = analysis.tpot_crossover
    edges = [t.at for t in crossover.turns] or [crossover.limit or ordered[-1]]
    steps = [
        b - a for x in edges for a, b in itertools.pairwise(ordered) if x / 2 <= a and b <= x * 2
    ]
    return min(steps, default=1)
