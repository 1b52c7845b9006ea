"""``acceptance-crossover``: the crossover policy with a threshold that follows the
speculative server's live accept length.

For: traffic whose acceptance moves (code drafts well, chat less), so a crossover measured
on one mix is wrong for another. Speculation's time per token scales with one over the
accept length (a verify step costs the same whatever is accepted), so the profile's
speculative curve is rescaled by measured over live accept length and the crossover read
again where it meets the plain curve. Live accept length is the mean over the speculative
backends' last polling window (counter deltas); without one, the profile's own crossover
applies. Parameters as ``crossover`` (``topology``, ``hysteresis``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specroute.policies.crossover import CrossoverParams, CrossoverPolicy
from specroute.policies.curves import Curves, curves
from specroute.policies.decision import Decision, PolicyError
from specroute.policies.params import parse_params
from specroute.policies.profile import Profile
from specroute.policies.view import RequestInfo, View


@dataclass(frozen=True)
class AcceptanceParams:
    topology: str = "shared"
    hysteresis: float = 0.0


class AcceptanceCrossoverPolicy(CrossoverPolicy):
    name = "acceptance-crossover"

    def __init__(self, params: CrossoverParams, curves: Curves, measured: float) -> None:
        super().__init__(params, curves.crossover())
        self.curves, self.measured = curves, measured
        self.live: float | None = None
        self._last = (measured, self.threshold)  # accept length and its crossover

    @classmethod
    def build(cls, raw: Mapping[str, Any], profile: Profile | None) -> AcceptanceCrossoverPolicy:
        parsed = parse_params(cls.name, AcceptanceParams, raw)
        params = parse_params(cls.name, CrossoverParams, {**vars(parsed)})
        if profile is None:
            raise PolicyError("the 'acceptance-crossover' policy needs a profile with curves")
        found = curves(profile)
        if found.accept_length is None:
            raise PolicyError("the profile does not say what accept length it was measured at")
        return cls(params, found, found.accept_length)

    def threshold_at(self, accept_length: float) -> float:
        """At the measured accept length, the profile's crossover exactly. Computed again
        only when the accept length changes (a new polling window), not per request."""
        if accept_length != self._last[0]:
            self._last = (accept_length, self.curves.crossover(self.measured / accept_length))
        return self._last[1]

    def choose(self, request: RequestInfo, view: View) -> Decision:
        live = [b.accept_length for b in view.healthy("spec") if b.accept_length is not None]
        self.live = sum(live) / len(live) if live else None
        self.threshold = self.threshold_at(self.live or self.measured)
        return super().choose(request, view)

    def describe(self) -> dict[str, Any]:
        return super().describe() | {"measured_accept_length": self.measured,
                                     "live_accept_length": self.live}  # fmt: skip
