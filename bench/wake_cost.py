"""What waking costs on this machine: the CPU time of one fixed piece of Python work, run
back to back and run after each of short sleeps, on one core.

An event loop sleeps when no socket is ready and wakes for the next one. On machines where
a core that slept runs the next instructions slower (caches and predictors gone cold, a
virtual CPU given back to its host, a lower clock), the same request costs more CPU time
in a process that sleeps between requests than in one kept busy. Spreading one load over
more worker processes makes each sleep more often, so this is the part of what more workers
cost that no router code can remove; ``specroute bench overhead`` measures it on a router
core before any load, so that its run says how large it is there."""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

SLEEPS_MS = (0.1, 1.0, 20.0)  # a busy loop's gaps, a quiet one's, a stream's chunk gap
_UNIT = 1500  # loop turns: about 70 µs of CPU on a core of 2.1 GHz, kept busy


def _unit() -> int:
    total = 0
    for i in range(_UNIT):
        total += i * i
    return total


@dataclass(frozen=True)
class WakeCost:
    """Median CPU time of the unit (µs) run back to back, and after each sleep of
    ``SLEEPS_MS``; ``core``: where it ran (None: wherever the scheduler put it)."""

    core: int | None
    busy_us: float
    woken_us: dict[str, float]  # by the sleep before each unit, in ms

    def ratio(self, sleep_ms: float) -> float:
        return self.woken_us[f"{sleep_ms:g}"] / self.busy_us

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    def note(self) -> str:
        after = ", ".join(
            f"{self.woken_us[f'{s:g}']:.0f} µs after each {s:g} ms sleep ({self.ratio(s):.2f}x)"
            for s in SLEEPS_MS
        )
        where = "" if self.core is None else f" on core {self.core}"
        return (
            f"what waking costs{where}: a fixed piece of Python work took {self.busy_us:.0f} "
            f"µs of CPU run back to back, {after}"
        )


def measure(core: int | None, seconds: float = 0.5) -> WakeCost:
    """The unit's median CPU time on ``core`` (the calling thread is moved there for the
    measurement and back), ``seconds`` back to back and as long after each sleep."""
    before = os.sched_getaffinity(0)
    if core is not None:
        os.sched_setaffinity(0, {core})
    try:
        busy = _median(0.0, seconds)
        woken = {f"{s:g}": _median(s / 1e3, seconds) for s in SLEEPS_MS}
    finally:
        os.sched_setaffinity(0, before)
    return WakeCost(core, busy, woken)


def _median(sleep: float, seconds: float) -> float:
    took: list[int] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end or len(took) < 5:
        began = time.thread_time_ns()
        _unit()
        took.append(time.thread_time_ns() - began)
        if sleep:
            time.sleep(sleep)
    return statistics.median(took) / 1e3
