"""``specroute bench coverage``: how often calibration's 95% interval holds the true
crossover, on noisy emulated servers in virtual time, against a fixed full grid.

Each calibration runs ``specroute calibrate``'s search (``profiler.calibration``) on a
``VirtualSweep`` of one hardware model with ``--noise``, seeded apart; the grid sweeps
every power of two up to the servers' largest batch, ``grid_repeats`` runs each, and is
analysed by the same code. The truth is the noise-free engine's crossover in virtual time
(``emulator.predict``), found between adjacent integer levels by bisection; the truth at
the levels a calibration measured (the crossover its interpolation aims at) is reported
beside it.
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TextIO

from specroute.crossing import crossing, log_margin
from specroute.emulator.config import EmulatorConfig
from specroute.emulator.noise import Noise
from specroute.emulator.predict import Speed, simulate
from specroute.event_loop import run as run_loop
from specroute.loadgen.dataset import Dataset
from specroute.loadgen.sweep import SweepPlan
from specroute.loadgen.virtual_sweep import VirtualSweep
from specroute.profiler.analysis import analyse
from specroute.profiler.calibration import CalibrationPlan, calibrate
from specroute.profiler.stats import Crossing
from specroute.profiler.sweep_data import load_sweep


@dataclass(frozen=True)
class CoveragePlan:
    configs: tuple[EmulatorConfig, ...]  # one per hardware model, with its noise
    dataset: Dataset
    calibrations: int = 51  # spread over the configs in turn
    input_len: int = 512
    output_len: int = 128
    grid_repeats: int = 3
    repeats: int = 3  # calibration's runs near the crossover
    precision: float = 0.3
    seed: int = 0
    grid_every: int = 1  # the grid beside every n-th calibration of each model; 0: never


@dataclass(frozen=True)
class Outcome:
    """One interval against the truth."""

    value: float | None
    low: float | None  # None: open
    high: float | None
    seconds: float  # backend (virtual) seconds
    levels: list[int]

    def covers(self, truth: float) -> bool:
        low = -math.inf if self.low is None else self.low
        high = math.inf if self.high is None else self.high
        return self.value is not None and low <= truth <= high

    @property
    def width(self) -> float:
        if self.value is None or self.low is None or self.high is None:
            return math.inf
        return self.high - self.low

    def as_json(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "ci": [self.low, self.high],
            "backend_seconds": self.seconds,
            "levels": self.levels,
        }


@dataclass
class Trial:
    hardware: str
    seed: int
    truth: float
    truth_at_levels: float | None
    adaptive: Outcome
    grid: Outcome
    wall_seconds: float

    def as_json(self) -> dict[str, Any]:
        return {
            "hardware": self.hardware,
            "seed": self.seed,
            "truth": self.truth,
            "truth_at_levels": self.truth_at_levels,
            "adaptive": self.adaptive.as_json(),
            "grid": self.grid.as_json(),
            "wall_seconds": round(self.wall_seconds, 1),
        }


@dataclass
class Truth:
    """The noise-free engine's per-request speeds, level by level, cached."""

    config: EmulatorConfig
    input_len: int
    output_len: int
    speeds: dict[int, tuple[Speed, Speed]] = field(default_factory=dict)

    def margin(self, level: int) -> float:
        if level not in self.speeds:
            quiet = replace(self.config, noise=Noise())
            self.speeds[level] = tuple(  # type: ignore[assignment]
                simulate(replace(quiet, mode=m), level, self.input_len, self.output_len)
                for m in ("base", "spec")
            )
        base, spec = self.speeds[level]
        return log_margin([base.per_request], [spec.per_request])[0]

    def at(self, levels: list[int]) -> float | None:
        """The crossover the curves give at these levels, by the one crossing finder."""
        return crossing(levels, [self.margin(lvl) for lvl in levels]).at

    def fine(self, highest: int) -> float:
        """The first crossing over powers of two up to ``highest``, narrowed by bisection
        to adjacent integer levels and interpolated between them."""
        grid = _grid(highest)
        found = self.at(grid)
        if found is None:
            raise ValueError(f"{self.config.hardware.name}: no crossover up to {highest}")
        lo = max(g for g in grid if g <= found)
        hi = min(g for g in grid if g > found) if found < grid[-1] else grid[-1]
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.margin(mid) > 0:
                lo = mid
            else:
                hi = mid
        value = self.at([lo, hi])
        assert value is not None
        return value


def _outcome(c: Crossing, seconds: float, levels: list[int]) -> Outcome:
    return Outcome(c.value, c.low, c.high, seconds, levels)


def _grid(highest: int) -> list[int]:
    return [2**i for i in range(int(math.log2(highest)) + 1)]


def run_trial(
    plan: CoveragePlan, config: EmulatorConfig, seed: int, truth: Truth, with_grid: bool
) -> Trial:
    """One calibration, and beside it the fixed grid when ``with_grid``."""
    started = time.monotonic()
    sweep_plan = SweepPlan("virtual", "virtual", plan.dataset, repeats=plan.repeats)
    calibration_plan = CalibrationPlan(
        sweep_plan, budget_seconds=math.inf, precision=plan.precision
    )
    highest = min(replace(config, mode=m).effective_max_running for m in ("spec", "base"))
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "calibration"
        sweep = VirtualSweep(
            sweep_plan, out, config, input_len=plan.input_len, output_len=plan.output_len, seed=seed
        )
        result = run_loop(calibrate(calibration_plan, out, sweep))
        adaptive = _outcome(
            result.analysis.tpot_crossover, result.backend_seconds, sorted(result.runs)
        )
        grid_plan = replace(sweep_plan, repeats=plan.grid_repeats)
        fixed = (
            _sweep_grid(plan, grid_plan, Path(folder) / "grid", config, seed, highest)
            if with_grid
            else Outcome(None, None, None, 0.0, [])
        )
    return Trial(
        config.hardware.name,
        seed,
        truth.fine(highest),
        truth.at(adaptive.levels),
        adaptive,
        fixed,
        time.monotonic() - started,
    )


def _sweep_grid(
    plan: CoveragePlan,
    grid_plan: SweepPlan,
    out: Path,
    config: EmulatorConfig,
    seed: int,
    highest: int,
) -> Outcome:
    """The fixed grid beside a calibration: every power of two up to ``highest``, seeded
    apart from it, analysed as calibration's sweeps are."""
    grid = VirtualSweep(
        grid_plan,
        out,
        config,
        input_len=plan.input_len,
        output_len=plan.output_len,
        seed=seed + 1_000_000,
    )

    async def sweep_grid() -> None:
        async with grid:
            for level in _grid(highest):
                await grid.measure(level)

    run_loop(sweep_grid())
    analysis = analyse(load_sweep(out))
    return _outcome(analysis.tpot_crossover, grid.backend_seconds, _grid(highest))


def summary(trials: list[Trial]) -> dict[str, Any]:
    """Coverage, median width and backend time of both methods, per hardware and overall."""

    def row(group: list[Trial]) -> dict[str, Any]:
        def of(pick: Callable[[Trial], Outcome]) -> dict[str, Any]:
            ran = [t for t in group if pick(t).levels]
            if not ran:
                return {"runs": 0}
            outcomes, group_ = [pick(t) for t in ran], ran
            return {
                "runs": len(ran),
                "coverage": sum(o.covers(t.truth) for o, t in zip(outcomes, group_, strict=True))
                / len(group_),
                "median_width": statistics.median(o.width for o in outcomes),
                "median_relative_width": statistics.median(
                    o.width / t.truth for o, t in zip(outcomes, group_, strict=True)
                ),
                "median_backend_seconds": statistics.median(o.seconds for o in outcomes),
                "open_intervals": sum(o.width == math.inf for o in outcomes),
            }

        at_levels = [t for t in group if t.truth_at_levels is not None]
        return {
            "calibrations": len(group),
            "truth": statistics.median(t.truth for t in group),
            "adaptive": of(lambda t: t.adaptive)
            | {
                "coverage_of_truth_at_its_levels": sum(
                    t.adaptive.covers(truth)
                    for t in at_levels
                    if (truth := t.truth_at_levels) is not None
                )
                / max(1, len(at_levels)),
            },
            "grid": of(lambda t: t.grid),
        }

    hardware = sorted({t.hardware for t in trials})
    return {"overall": row(trials)} | {
        h: row([t for t in trials if t.hardware == h]) for h in hardware
    }


def render(result: dict[str, Any]) -> str:
    lines = [
        "| hardware | calibrations | truth | coverage | grid coverage (grids) | median width "
        "| grid width | median backend s | grid backend s | time ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in result["summary"].items():
        a, g = r["adaptive"], r["grid"]
        if not g["runs"]:
            g = {
                "coverage": math.nan,
                "median_width": math.nan,
                "median_backend_seconds": math.nan,
                "runs": 0,
            }
        lines.append(
            f"| {name} | {r['calibrations']} | {r['truth']:.1f} | {a['coverage']:.0%} "
            f"| {g['coverage']:.0%} ({g['runs']}) | {a['median_width']:.2f} "
            f"| {g['median_width']:.2f} | {a['median_backend_seconds']:.0f} "
            f"| {g['median_backend_seconds']:.0f} "
            f"| {a['median_backend_seconds'] / g['median_backend_seconds']:.2f} |"
        )
    return "\n".join(lines)


def coverage(plan: CoveragePlan, stream: TextIO = sys.stderr) -> dict[str, Any]:
    truths = {c.hardware.name: Truth(c, plan.input_len, plan.output_len) for c in plan.configs}
    trials: list[Trial] = []
    started = time.monotonic()
    for i in range(plan.calibrations):
        config = plan.configs[i % len(plan.configs)]
        nth = i // len(plan.configs) + 1  # of this model's calibrations
        grid = plan.grid_every > 0 and nth % plan.grid_every == 0
        trial = run_trial(plan, config, plan.seed + i, truths[config.hardware.name], grid)
        trials.append(trial)
        a, g = trial.adaptive, trial.grid
        covered = sum(t.adaptive.covers(t.truth) for t in trials)
        elapsed = time.monotonic() - started
        stream.write(
            f"[{i + 1:>3}/{plan.calibrations}] {trial.hardware:<18} truth {trial.truth:6.1f}  "
            f"adaptive {_interval(a)} {a.seconds:6.0f} s  grid {_interval(g)} {g.seconds:6.0f} s  "
            f"covered {covered}/{len(trials)}  "
            f"(~{elapsed / len(trials) * (plan.calibrations - len(trials)):.0f} s left)\n"
        )
        stream.flush()
    noise = plan.configs[0].noise.describe()
    return {
        "settings": {
            "hardware": [c.hardware.name for c in plan.configs],
            "noise": noise,
            "calibrations": plan.calibrations,
            "input_len": plan.input_len,
            "output_len": plan.output_len,
            "repeats_near_crossover": plan.repeats,
            "grid_repeats": plan.grid_repeats,
            "grid_every": plan.grid_every,
            "precision": plan.precision,
            "time": "virtual: the emulator's engine in modelled seconds, no server",
        },
        "summary": summary(trials),
        "trials": [t.as_json() for t in trials],
        "wall_seconds": round(time.monotonic() - started, 1),
    }


def _interval(o: Outcome) -> str:
    if o.value is None:
        return "      no crossing       "
    low = "-inf" if o.low is None else f"{o.low:.1f}"
    high = "inf" if o.high is None else f"{o.high:.1f}"
    return f"{o.value:6.1f} [{low:>6}, {high:>6}]"
