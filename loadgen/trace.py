"""Time-varying load for a comparison: phases of fixed concurrency (a closed loop whose
number of clients changes at each phase boundary) or of a fixed request rate (Poisson
arrivals, an open loop: requests keep coming whether or not the servers keep up). A phase
may also say which prompts it sends: synthetic ones of a given length, or of one of several
lengths drawn per request."""

from __future__ import annotations

import json
import math
import random
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path


class TraceError(ValueError):
    """A trace that cannot be used, with the reason."""


@dataclass(frozen=True)
class Phase:
    seconds: float
    concurrency: int = 0  # clients sending back to back
    rate: float | None = None  # or: requests per second, Poisson arrivals
    input_len: tuple[int, ...] = ()  # synthetic prompts of these lengths; (): the dataset's

    @property
    def load(self) -> str:
        return f"{self.rate:g}/s" if self.rate is not None else str(self.concurrency)


@dataclass(frozen=True)
class Trace:
    name: str
    phases: tuple[Phase, ...]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def input_lens(self) -> tuple[int, ...]:
        """Every prompt length a phase names, ascending."""
        return tuple(sorted({n for p in self.phases for n in p.input_len}))

    @property
    def peak(self) -> int:
        """The most clients any closed-loop phase needs."""
        return max(p.concurrency for p in self.phases)

    def phase_at(self, elapsed: float) -> int | None:
        """The index of the phase running ``elapsed`` seconds in, None after the last."""
        end = 0.0
        for i, phase in enumerate(self.phases):
            end += phase.seconds
            if elapsed < end:
                return i
        return None

    def spans(self, settle: float = 0.0) -> list[tuple[float, float, float]]:
        """Each phase's start, where its steady state begins (after ``settle`` seconds, at
        most half the phase) and its end, in seconds from the trace's start."""
        spans, start = [], 0.0
        for phase in self.phases:
            end = start + phase.seconds
            spans.append((start, start + min(settle, phase.seconds / 2), end))
            start = end
        return spans

    def arrivals(self, seed: int = 0) -> list[float]:
        """When the rate phases' requests arrive, seconds from the start: the same list for
        the same seed, so live and offline replays of a trace meet the same traffic."""
        rng = random.Random(f"arrivals|{seed}")
        times: list[float] = []
        start = 0.0
        for phase in self.phases:
            if phase.rate:
                t = start + rng.expovariate(phase.rate)
                while t < start + phase.seconds:
                    times.append(t)
                    t += rng.expovariate(phase.rate)
            start += phase.seconds
        return times


def _doubling(low: int, high: int) -> list[int]:
    levels = [low]
    while levels[-1] * 2 < high:
        levels.append(levels[-1] * 2)
    return [*levels, high]


def diurnal(hour: float) -> float:
    """A day's traffic relative to its peak: 0.1 at 03:00, 1.0 at 15:00, a cosine between."""
    return 0.55 - 0.45 * math.cos(2 * math.pi * (hour - 3) / 24)


def named_trace(
    name: str, peak: int, phase_seconds: float, peak_rate: float | None = None
) -> Trace:
    """``ramp``: doubling from 1 to ``peak`` and back; ``steps``: low, peak, low, peak;
    ``poisson-day``: 24 hourly phases of Poisson arrivals following :func:`diurnal` up to
    ``peak_rate`` requests per second; anything else is a JSON file of phases."""
    if name == "poisson-day":
        if peak_rate is None or peak_rate <= 0:
            raise TraceError("poisson-day needs --peak-rate > 0, the busiest hour's requests/s")
        return Trace(
            name,
            tuple(Phase(phase_seconds, rate=round(peak_rate * diurnal(h), 3)) for h in range(24)),
        )
    if name == "ramp":
        up = _doubling(1, peak)
        levels = up + up[-2::-1]
    elif name == "steps":
        levels = [1, peak, 1, peak]
    else:
        return load_trace(Path(name))
    return Trace(name, tuple(Phase(phase_seconds, c) for c in levels))


def prompt_label(input_len: Iterable[int]) -> str:
    """A phase's prompt lengths as tables and plots name them: each length once, with how
    many of the phase's draws it has when more than one (``512x5|8192`` for five in six
    short); "" when it sends the run's dataset."""
    counts = Counter(input_len)
    return "|".join(f"{n}x{k}" if k > 1 else str(n) for n, k in counts.items())


def load_trace(path: Path) -> Trace:
    """``[{"seconds": S, "concurrency": C} or {"seconds": S, "rate": R}, ...]``, each
    optionally with ``"input_len": N`` or ``[N1, N2, ...]`` (its prompts: synthetic ones of
    that length, or of one of those lengths drawn per request)."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TraceError(
            f"{path}: not ramp, steps, poisson-day or a readable file ({exc.strerror})"
        ) from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not JSON: {exc.msg}") from None
    if not isinstance(data, list) or not data:
        raise TraceError(f"{path}: expected a list of phases")
    phases = tuple(_phase(item, f"{path}: phase {i}") for i, item in enumerate(data))
    return Trace(path.stem, phases)


def _phase(item: object, where: str) -> Phase:
    if (
        not isinstance(item, dict)
        or "seconds" not in item
        or ("concurrency" in item) == ("rate" in item)
    ):
        raise TraceError(f"{where} needs seconds and one of concurrency or rate")
    try:
        seconds = float(item["seconds"])
        if "rate" in item:
            phase = Phase(seconds, rate=float(item["rate"]))
        else:
            phase = Phase(seconds, int(item["concurrency"]))
    except (TypeError, ValueError):
        raise TraceError(f"{where}: seconds, concurrency and rate must be numbers") from None
    if not seconds > 0 or phase.concurrency < 0 or (phase.rate is not None and phase.rate < 0):
        raise TraceError(f"{where} needs seconds > 0 and a load >= 0")
    if "input_len" in item:
        phase = replace(phase, input_len=_input_len(item["input_len"], where))
    return phase


def _input_len(given: object, where: str) -> tuple[int, ...]:
    lengths = given if isinstance(given, list) else [given]
    if not lengths or not all(
        isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths
    ):
        raise TraceError(f"{where}: input_len must be a positive integer or a list of them")
    return tuple(lengths)
