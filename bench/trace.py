"""Time-varying load for a comparison: phases of fixed concurrency (a closed loop whose
number of clients changes at each phase boundary)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


class TraceError(ValueError):
    """A trace that cannot be used, with the reason."""


@dataclass(frozen=True)
class Phase:
    seconds: float
    concurrency: int


@dataclass(frozen=True)
class Trace:
    name: str
    phases: tuple[Phase, ...]

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.phases)

    @property
    def peak(self) -> int:
        return max(p.concurrency for p in self.phases)

    def phase_at(self, elapsed: float) -> int | None:
        """The index of the phase running ``elapsed`` seconds in, None after the last."""
        end = 0.0
        for i, phase in enumerate(self.phases):
            end += phase.seconds
            if elapsed < end:
                return i
        return None


def _doubling(low: int, high: int) -> list[int]:
    levels = [low]
    while levels[-1] * 2 < high:
        levels.append(levels[-1] * 2)
    return [*levels, high]


def named_trace(name: str, peak: int, phase_seconds: float) -> Trace:
    """``ramp``: doubling from 1 to ``peak`` and back; ``steps``: low, peak, low, peak;
    anything else is a JSON file of ``[{"seconds": S, "concurrency": C}, ...]``."""
    if name == "ramp":
        up = _doubling(1, peak)
        levels = up + up[-2::-1]
    elif name == "steps":
        levels = [1, peak, 1, peak]
    else:
        return load_trace(Path(name))
    return Trace(name, tuple(Phase(phase_seconds, c) for c in levels))


def load_trace(path: Path) -> Trace:
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise TraceError(f"{path}: not ramp, steps or a readable file ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not JSON: {exc.msg}") from None
    if not isinstance(data, list) or not data:
        raise TraceError(f"{path}: expected a list of phases")
    phases = []
    for i, item in enumerate(data):
        try:
            phase = Phase(float(item["seconds"]), int(item["concurrency"]))
        except (KeyError, TypeError, ValueError):
            raise TraceError(f"{path}: phase {i} needs seconds and concurrency") from None
        if phase.seconds <= 0 or phase.concurrency < 0:
            raise TraceError(f"{path}: phase {i} needs seconds > 0 and concurrency >= 0")
        phases.append(phase)
    return Trace(path.stem, tuple(phases))
