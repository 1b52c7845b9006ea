"""``specroute bench capacity``: how many concurrent streams one emulator process sustains
in real time.

The emulator sleeps each engine step's modelled duration and then delivers the tokens.
That only stays faithful while the process keeps up: parsing requests, writing SSE chunks
and running the scheduler all cost CPU, and once a step's real wall time exceeds what the
hardware model asked for, the machine running the emulator -- not the modelled GPU -- sets
the pace. Any result gathered beyond that point measures this machine, not SGLang.

This benchmark finds that point. It starts ``specroute emulate`` as a process of its own,
then for each concurrency level N runs the bench's closed loop against it: N streaming chat
requests, all started at once, each replaced as soon as it ends; once every stream has its
first token, a window of fixed length, over which it reads the emulator's own step
counters::

    lag = (actual step seconds) / (intended step seconds) - 1

A lag above 5% means the emulator runs slow. The verdict is the highest level within 5%,
and where the lag passes 5% between two levels, by the project's one crossing finder.

The load generator runs in this process, on its own event loop, but shares the machine's
CPUs: on a small machine the client's own work is part of what is measured, so both
processes' CPU use is reported. Lag need not mean a saturated CPU: an event loop that wakes
late after a burst of SSE writes lags too, at low CPU use; the CPU columns tell them apart.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import aiohttp

from specroute import prometheus
from specroute.bench.process_cpu import cpu_seconds
from specroute.crossing import Crossing, crossing
from specroute.loadgen.client import request_bodies, served_model
from specroute.loadgen.closed_loop import LevelRun, run_level
from specroute.loadgen.dataset import synthetic
from specroute.loadgen.drain import drained, loads
from specroute.loadgen.spawn import Spawned, spawned

LAG_LIMIT = 0.05
INPUT_LEN = 32  # prompt tokens: the benchmark is about delivering, not prefilling
MIN_MAX_RUNNING = 4096  # --max-running-requests: never the limit being measured
DRAIN_SECONDS = 120.0  # for a level's cancelled streams to leave (a slow model's step is long)
POLL_SECONDS = 0.5  # the emulator's running count, polled through the window
INTENDED = "specroute_emulator_step_intended_seconds_total"
ACTUAL = "specroute_emulator_step_actual_seconds_total"
STEPS = "specroute_emulator_steps_total"
LAG_GAUGE = "specroute_emulator_lag_ratio"
_COUNTERS = (INTENDED, ACTUAL, STEPS, LAG_GAUGE)


@dataclass(frozen=True)
class CapacityPlan:
    hardware: str = "kimi-k2.5-8x-pcie-fitted"
    mode: Literal["spec", "base"] = "spec"
    levels: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    seconds: float = 8.0  # the measured window per level
    warmup: float = 20.0  # at most this long for a level's streams all to have a first token
    max_tokens: int = 256
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.levels or min(self.levels) < 1 or list(self.levels) != sorted(self.levels):
            raise ValueError(f"capacity levels must be ascending and >= 1, got {self.levels}")
        if self.seconds <= 0 or self.warmup < 0 or self.max_tokens < 1 or self.time_scale <= 0:
            raise ValueError("capacity needs seconds, max_tokens, time_scale > 0, warmup >= 0")


@dataclass(frozen=True)
class LevelResult:
    """One level; a level whose window never opened has only its errors."""

    level: int
    errors: int  # failed requests in the level, warm-up included
    ramped: bool = True  # every stream had a first token within the warm-up: a window opened
    seconds: float = 0.0  # the window
    streams: float = 0.0  # mean running requests the emulator reported in the window
    tokens: int = 0  # received in the window, by the chunks; the emulator counts a request's
    # tokens (sglang:generation_tokens_total, as SGLang) only when it ends
    chunks: int = 0
    tokens_per_s: float = 0.0
    chunks_per_s: float = 0.0
    completed: int = 0  # streams that ended in the window
    steps: int = 0
    step_ms: float | None = None  # mean intended (modelled) step time in the window
    intended_s: float = 0.0
    actual_s: float = 0.0
    lag: float | None = None  # actual / intended - 1 over the window; None if no step finished
    lag_gauge: float | None = None  # the emulator's own recent-steps gauge at the end
    emulator_cpu: float | None = None  # CPU seconds per wall second; None without /proc
    client_cpu: float = 0.0  # this process's


@dataclass(frozen=True)
class _Snapshot:
    at: float
    counters: dict[str, float]
    emulator_cpu: float | None
    client_cpu: float


class _Watch:
    """The closed loop's window hook: the emulator's counters and both processes' CPU time
    as the window opens and as it closes, and the emulator's running count in between."""

    def __init__(self, session: aiohttp.ClientSession, emulator: Spawned) -> None:
        self.session, self.emulator = session, emulator
        self.snapshots: list[_Snapshot] = []
        self.running: list[int] = []
        self._poller: asyncio.Task[None] | None = None

    async def __call__(self) -> None:
        self.snapshots.append(await self._snapshot())
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll())
        else:
            await self.stop()

    async def stop(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)

    async def _snapshot(self) -> _Snapshot:
        async with self.session.get(f"{self.emulator.url}/metrics") as r:
            text = await r.text()
        return _Snapshot(
            time.monotonic(),
            prometheus.sums(text, _COUNTERS),
            cpu_seconds(self.emulator.process.pid),
            time.process_time(),
        )

    async def _poll(self) -> None:
        while True:
            self.running.append(await _running(self.session, self.emulator.url))
            await asyncio.sleep(POLL_SECONDS)


async def measure_capacity(
    plan: CapacityPlan, on_level: Callable[[LevelResult], None] | None = None
) -> list[LevelResult]:
    """Every level of ``plan`` against one emulator process, in order. ``on_level`` sees each
    result as its level ends, so a caller keeps them if a later level fails."""
    flags = (
        "emulate",
        "--mode",
        plan.mode,
        "--hardware",
        plan.hardware,
        "--time-scale",
        f"{plan.time_scale:g}",
        "--max-running-requests",
        str(max(MIN_MAX_RUNNING, *plan.levels)),
    )
    results: list[LevelResult] = []
    async with (
        spawned(*flags) as emulator,
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=10),
        ) as session,
    ):
        model = await served_model(session, emulator.url)
        bodies = request_bodies(synthetic(INPUT_LEN, plan.max_tokens), model, ignore_eos=True)
        for level in plan.levels:
            watch = _Watch(session, emulator)
            try:
                run = await run_level(
                    session,
                    emulator.url,
                    bodies,
                    backend=plan.mode,
                    level=level,
                    repeat=0,
                    duration=plan.seconds,
                    give_up_after=plan.warmup + plan.seconds,
                    ramp="at-once",
                    cut_off=True,
                    at_window=watch,
                )
            finally:
                await watch.stop()
            result = _result(run, watch)
            results.append(result)
            if on_level is not None:
                on_level(result)
            if not await drained(session, [emulator.url], DRAIN_SECONDS):
                raise RuntimeError(
                    f"the emulator still ran streams {DRAIN_SECONDS:g} s after level {level} "
                    f"ended; it said: {emulator.said()}"
                )
    return results


def _result(run: LevelRun, watch: _Watch) -> LevelResult:
    level, t0, t1, records = run.level, run.t0, run.t1, run.records
    if len(watch.snapshots) < 2:
        return LevelResult(level, run.failures, ramped=False)
    before, after = watch.snapshots
    wall, window = after.at - before.at, t1 - t0

    def grew(name: str) -> float:
        return after.counters.get(name, 0.0) - before.counters.get(name, 0.0)

    chunks = [n for r in records for t, n in r.chunks if t0 <= t <= t1]
    intended, actual, steps = grew(INTENDED), grew(ACTUAL), round(grew(STEPS))
    cpu = None
    if before.emulator_cpu is not None and after.emulator_cpu is not None:
        cpu = (after.emulator_cpu - before.emulator_cpu) / wall
    return LevelResult(
        level=level,
        errors=run.failures,
        seconds=window,
        streams=statistics.fmean(watch.running) if watch.running else 0.0,
        tokens=sum(chunks),
        chunks=len(chunks),
        tokens_per_s=sum(chunks) / window,
        chunks_per_s=len(chunks) / window,
        completed=sum(1 for r in records if r.ok and r.end is not None and t0 <= r.end <= t1),
        steps=steps,
        step_ms=1000 * intended / steps if steps else None,
        intended_s=intended,
        actual_s=actual,
        lag=actual / intended - 1.0 if intended > 0 else None,
        lag_gauge=after.counters.get(LAG_GAUGE),
        emulator_cpu=cpu,
        client_cpu=(after.client_cpu - before.client_cpu) / wall,
    )


async def _running(session: aiohttp.ClientSession, url: str) -> int:
    """The requests the emulator runs right now, from its ``/v1/loads``."""
    stats = await loads(session, url)
    if stats is None or stats.running is None:
        raise RuntimeError(f"{url}/v1/loads did not say how many requests run")
    return int(stats.running)


# -- the summary ----------------------------------------------------------------------------
def lag_crossing(results: Sequence[LevelResult], limit: float = LAG_LIMIT) -> Crossing | None:
    """Where the lag passes ``limit``, over the levels measured in a row from the first
    (margin ``limit - lag``, by the one crossing finder); None if the first has no lag."""
    levels, margins = [], []
    for r in results:
        if r.lag is None:
            break
        levels.append(r.level)
        margins.append(limit - r.lag)
    return crossing(levels, margins) if levels else None


def sustained(results: Sequence[LevelResult], limit: float = LAG_LIMIT) -> int | None:
    """The highest level before the first one whose lag reaches ``limit`` or is unknown."""
    best = None
    for r in results:
        if r.lag is None or r.lag >= limit:
            break
        best = r.level
    return best


def verdict(results: Sequence[LevelResult], limit: float = LAG_LIMIT) -> str:
    if not results:
        return "no level measured"
    pct, first = f"{100 * limit:.0f}%", results[0]
    best, cross = sustained(results, limit), lag_crossing(results, limit)
    if cross is None:
        return f"level {first.level}: {_unmeasured(first)}"
    if cross.bound == "below" or best is None:
        return f"lag reaches {pct} already at the lowest level ({first.level})"
    if cross.at is not None:
        return (
            f"sustained: {best} streams within {pct} lag; lag passes {pct} near "
            f"{cross.at:.0f} streams"
        )
    after = [r for r in results if r.level > best]
    if not after:
        return f"sustained: all levels up to {best} streams within {pct} lag (no crossing)"
    unmeasured = f"level {after[0].level}: {_unmeasured(after[0])}"
    return f"sustained: {best} streams within {pct} lag; {unmeasured}"


def _unmeasured(r: LevelResult) -> str:
    if not r.ramped:
        return "its streams did not all start within the warm-up (raise --warmup)"
    return "no step finished in its window (raise --seconds-per-level)"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def _lag(x: float | None) -> str:
    return "n/a" if x is None else f"{100 * x:+.1f}%"


def header(plan: CapacityPlan) -> str:
    cpus = os.cpu_count() or 0
    shared = "; on so few cores the client competes for CPU" if cpus <= 4 else ""
    return (
        f"emulator capacity: {plan.hardware}, {plan.mode}, time scale {plan.time_scale:g}, "
        f"{plan.max_tokens} tokens per stream, {plan.seconds:g} s per level\n"
        f"machine: {cpus} CPUs shared by the emulator and this load generator "
        f"(separate processes, separate event loops{shared})"
    )


def progress_line(r: LevelResult) -> str:
    return (
        f"level {r.level:5d}: {r.streams:7.1f} streams, {r.tokens_per_s:8.0f} tok/s, "
        f"lag {_lag(r.lag):>7} over {r.steps} steps of {_ms(r.step_ms)} ms "
        f"(gauge {_lag(r.lag_gauge)}), emulator cpu {_pct(r.emulator_cpu)}, "
        f"client cpu {_pct(r.client_cpu)}, {r.completed} done, {r.errors} errors"
    )


def render(results: Sequence[LevelResult], limit: float = LAG_LIMIT) -> str:
    """The table of every level, then the verdict."""
    rows = [
        f"{'level':>6} {'streams':>8} {'tok/s':>9} {'chunks/s':>9} {'step ms':>8} "
        f"{'lag':>8} {'emu cpu':>8} {'gen cpu':>8}"
    ]
    for r in results:
        rows.append(
            f"{r.level:>6} {r.streams:>8.1f} {r.tokens_per_s:>9.0f} "
            f"{r.chunks_per_s:>9.0f} {_ms(r.step_ms):>8} {_lag(r.lag):>8} "
            f"{_pct(r.emulator_cpu):>8} {_pct(r.client_cpu):>8}"
        )
    return "\n".join([*rows, verdict(results, limit)])


def as_json(plan: CapacityPlan, results: Sequence[LevelResult]) -> dict[str, Any]:
    cross = lag_crossing(results)
    return {
        "benchmark": "emulator_capacity",
        "hardware": plan.hardware,
        "mode": plan.mode,
        "time_scale": plan.time_scale,
        "max_tokens": plan.max_tokens,
        "input_len": INPUT_LEN,
        "seconds_per_level": plan.seconds,
        "warmup_seconds": plan.warmup,
        "lag_limit": LAG_LIMIT,
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "results": [asdict(r) for r in results],
        "sustained_streams": sustained(results),
        "crossing_streams": None if cross is None else cross.at,
        "crossing": None if cross is None else asdict(cross),
        "verdict": verdict(results),
    }
