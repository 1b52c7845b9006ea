"""Calibration over context: the crossover per context bucket (prompt length), one
bucket after another, shortest first, each by ``calibrate``.

The buckets share one budget: each gets what is left divided by the buckets still to go,
so what one leaves over goes to the next. What a bucket found starts the next one's search
(``start_level``): it measures level 1 (one run, so a loss at the lowest load is never
missed) and then doubles from the largest power of two at most a quarter of the previous
bucket's lowest crossing, instead of from 1. A quarter: a crossing that moved down with
context by up to 2x still has a level measured a doubling below it, where its interval's
lower end can stop (an interval reaches out to the levels measured past its ends); one
that moved further lies between 1 and the start, a bracket the search halves as it halves
any other.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from specroute.loadgen.sweep import Sweep
from specroute.profiler.analysis import Analysis
from specroute.profiler.calibration import Calibration, CalibrationPlan, calibrate


@dataclass(frozen=True)
class Bucket:
    """One context bucket to calibrate: its plan (whose budget ``calibrate_contexts`` sets
    as the buckets go), its sweep folder, and where its runs come from (by default HTTP)."""

    plan: CalibrationPlan
    out: Path
    sweep: Sweep | None = None


def start_level(previous: Analysis) -> int:
    """Where the next bucket's doubling starts: the largest power of two at most a quarter
    of the previous bucket's lowest crossing (any direction), or of the highest level it
    measured when speculation paid at every one; 1 when it paid at none."""
    crossover = previous.tpot_crossover
    if crossover.turns:
        edge = crossover.turns[0].at
    elif crossover.bands:
        edge = float(max(previous.levels))
    else:
        return 1
    return 2 ** math.floor(math.log2(edge / 4)) if edge >= 4 else 1


async def calibrate_contexts(buckets: Sequence[Bucket], budget_seconds: float) -> list[Calibration]:
    """``calibrate`` each bucket in turn within one budget of backend time: each gets what
    is left over the buckets still to go, and starts where the one before suggests."""
    found: list[Calibration] = []
    spent, start = 0.0, 1
    for i, bucket in enumerate(buckets):
        share = (budget_seconds - spent) / (len(buckets) - i)
        plan = replace(bucket.plan, budget_seconds=share)
        result = await calibrate(plan, bucket.out, bucket.sweep, start)
        spent += result.backend_seconds
        start = start_level(result.analysis)
        found.append(result)
    return found
