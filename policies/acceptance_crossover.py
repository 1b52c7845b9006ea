"""``acceptance-crossover``: the crossover policy with a threshold that follows the
speculative server's live accept length.

For: traffic whose acceptance moves (code drafts well, chat less), so a crossover measured
on one mix is wrong for another. Speculation's time per token scales with one over the
accept length (a verify step costs the same whatever is accepted), so the profile's
speculative curve is rescaled by measured over live accept length and the crossover read
again where it meets the plain curve; where the rescaled curve pays in bands (a mixture of
experts at medium load), it routes by those bands as ``crossover`` does by a profile's.
Live accept length is the mean over the speculative backends' last window with verify
steps (counter deltas), if younger than ``accept_max_age`` seconds; without one, the
profile's own curves apply. A
speculative pool that a low accept length keeps idle would never be measured again, so
while that is so one request in ``1 / probe_share`` goes there anyway (reason ``probe``).
Parameters as ``crossover`` (``topology``, ``hysteresis``), ``accept_max_age`` (60 s) and
``probe_share`` (0.02).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from specroute.crossing import Band, first_top
from specroute.policies.crossover import (
    TOPOLOGY,
    CrossoverParams,
    CrossoverPolicy,
    Topology,
    within,
)
from specroute.policies.curves import Curves, curves
from specroute.policies.decision import Decision, PolicyError
from specroute.policies.params import parse_params
from specroute.policies.policy import pick
from specroute.policies.profile import Profile, up_to
from specroute.policies.view import RequestInfo, View


@dataclass(frozen=True)
class AcceptanceParams:
    topology: Topology = field(default="shared", metadata={"help": TOPOLOGY})
    hysteresis: float = field(default=0.0, metadata={"help": "as crossover's"})
    accept_max_age: float = field(
        default=60.0, metadata={"help": "seconds: an older live accept length is not believed"}
    )
    probe_share: float = field(
        default=0.02,
        metadata={
            "help": "of the requests the live accept length keeps from speculating, "
            "the share sent to speculate anyway, so that it is measured again"
        },
    )

    def __post_init__(self) -> None:
        if self.accept_max_age <= 0:
            raise ValueError(f"accept_max_age must be > 0, got {self.accept_max_age}")
        if not 0 <= self.probe_share <= 1:
            raise ValueError(f"probe_share must be in [0, 1], got {self.probe_share}")


_OUTSIDE = ("above_crossover", "outside_band")  # the crossover's reasons for the plain pool


class AcceptanceCrossoverPolicy(CrossoverPolicy):
    name = "acceptance-crossover"

    def __init__(
        self, params: CrossoverParams, live: AcceptanceParams, curves: Curves, measured: float
    ) -> None:
        routing = _routing(curves, 1.0)
        super().__init__(params, *routing)
        self.curves, self.measured, self.live_params = curves, measured, live
        self.live: float | None = None
        self._last = (measured, routing)  # an accept length and what it routes by
        # where the measured accept length speculates
        self._profiled = up_to(self.threshold) if self.bands is None else self.bands
        self._kept_away = 0  # requests the live accept length sent to the plain pool

    @classmethod
    def build(cls, raw: Mapping[str, Any], profile: Profile | None) -> AcceptanceCrossoverPolicy:
        parsed = parse_params(cls.name, AcceptanceParams, raw)
        shared = {"topology": parsed.topology, "hysteresis": parsed.hysteresis}
        params = parse_params(cls.name, CrossoverParams, shared)
        if profile is None:
            raise PolicyError("the 'acceptance-crossover' policy needs a profile with curves")
        found = curves(profile)
        if found.accept_length is None:
            raise PolicyError("the profile does not say what accept length it was measured at")
        return cls(params, parsed, found, found.accept_length)

    def routing_at(self, accept_length: float) -> tuple[float, tuple[Band, ...] | None]:
        """The crossover, and the bands when speculation pays other than from the lowest
        load up to it; at the measured accept length, the profile's curves' own. Computed
        again only when the accept length changes (a new polling window), not per request."""
        if accept_length != self._last[0]:
            self._last = (accept_length, _routing(self.curves, self.measured / accept_length))
        return self._last[1]

    def threshold_at(self, accept_length: float) -> float:
        return self.routing_at(accept_length)[0]

    def choose(self, request: RequestInfo, view: View) -> Decision:
        self.live = view.accept_length(self.live_params.accept_max_age)
        self.threshold, self.bands = self.routing_at(self.live or self.measured)
        decision = super().choose(request, view)
        if decision.reason not in _OUTSIDE or not self._kept_away_by_acceptance(view):
            return decision
        self._kept_away += 1
        share = self.live_params.probe_share
        if share > 0 and self._kept_away >= 1 / share:
            self._kept_away = 0
            return pick(view, "spec", "probe")
        return decision

    def _kept_away_by_acceptance(self, view: View) -> bool:
        """Whether the measured accept length would have speculated where the live one does
        not: then only probes keep that accept length measured."""
        if self.live is None or self.live >= self.measured:
            return False
        return within(view.seat(self.params.topology).load + 1, self._profiled)

    def describe(self) -> dict[str, Any]:
        return super().describe() | {
            "measured_accept_length": self.measured,
            "live_accept_length": self.live,
            "accept_max_age": self.live_params.accept_max_age,
            "probe_share": self.live_params.probe_share,
        }


def _routing(curves: Curves, accept_scale: float) -> tuple[float, tuple[Band, ...] | None]:
    """What the crossover policy routes by at this scale: one crossover, with bands only
    when speculation pays elsewhere than from the lowest load up to it (a mixture of
    experts' band of medium load, say)."""
    bands = curves.bands(accept_scale)
    if len(bands) <= 1 and (not bands or bands[0][0] is None):
        return curves.crossover(accept_scale), None
    return first_top(bands), bands
