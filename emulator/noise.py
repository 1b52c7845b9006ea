"""Timing noise like a real engine's, off by default: a run-to-run multiplier and
step-to-step jitter on every step's modelled time.

``run``: each time the engine starts work after being idle (a benchmark's run: the closed
loop drains the server between runs) it draws a multiplier ``exp(N(0, run))``, kept until
it is idle again; its median is 1, so the log of a ratio of two servers is unbiased.
``step``: every step's time is multiplied by ``exp(N(-step**2 / 2, step))``, whose mean
is 1, so a request's time per token (a mean over its steps) is unbiased.

Both are seeded: the same seed, mode and sequence of steps give the same times.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# The defaults of ``--noise default``. Not measured on a serving engine: the H200
# step-time files measured the same kernels in two sessions (decode, verify and draft at
# batches 1-128), whose medians differ by 0.7% rms (0.5% per session), a floor with no
# scheduler, Python or network in it; a serving engine adds those. The values here are
# four times that floor between runs and 5% per step, stated as assumptions.
DEFAULT_RUN = 0.02
DEFAULT_STEP = 0.05


class NoiseError(ValueError):
    """A ``--noise`` setting that cannot be used, with the reason."""


@dataclass(frozen=True)
class Noise:
    run: float = 0.0  # sigma of the log of the per-run multiplier
    step: float = 0.0  # sigma of the log of the per-step multiplier

    @property
    def off(self) -> bool:
        return self.run == 0.0 and self.step == 0.0

    def describe(self) -> dict[str, float]:
        return {"run": self.run, "step": self.step}


NO_NOISE = Noise()


def parse_noise(text: str) -> Noise:
    """``run=0.02,step=0.05``, either key alone, ``default`` or ``off``."""
    text = text.strip()
    if text == "off":
        return Noise()
    if text == "default":
        return Noise(DEFAULT_RUN, DEFAULT_STEP)
    values = {"run": 0.0, "step": 0.0}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in values:
            raise NoiseError(f"noise keys are run and step (or 'default', 'off'); got {key!r}")
        try:
            sigma = float(value)
        except ValueError:
            raise NoiseError(f"noise {key} must be a number, got {value!r}") from None
        if not 0.0 <= sigma <= 1.0:
            raise NoiseError(f"noise {key} must be between 0 and 1, got {value!r}")
        values[key] = sigma
    return Noise(values["run"], values["step"])


class NoiseSource:
    """The multipliers one engine applies, drawn from its own seeded generator."""

    def __init__(self, noise: Noise, key: str) -> None:
        self.noise = noise
        self._rng = random.Random(f"noise|{key}")
        self._run = 1.0
        self._idle = True

    def idle(self) -> None:
        """The engine has nothing to do: the next step starts a new run."""
        self._idle = True

    def factor(self) -> float:
        """The multiplier of the next step's time."""
        noise = self.noise
        if self._idle:
            self._idle = False
            self._run = math.exp(self._rng.gauss(0.0, noise.run)) if noise.run else 1.0
        if not noise.step:
            return self._run
        return self._run * math.exp(self._rng.gauss(-(noise.step**2) / 2, noise.step))
