"""``crossover``: speculate while live concurrency is below the measured crossover.

For: the common case, one speculative and one plain server, or several of each. The
crossover is measured for one server, so it is compared with the load where the request
would run: ``topology=shared`` (each speculative server shares its GPUs with a plain one,
a GPU group) with the load of the least-loaded group, both pools' requests there;
``topology=partitioned`` (each server on GPUs of its own) with the load of the
least-loaded speculative server, spilling the rest to the plain pool. ``hysteresis``
keeps the choice from flapping at the threshold: once above it, a server or group speculates
again only below ``crossover - hysteresis``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from specroute.policies.decision import Decision, PolicyError
from specroute.policies.params import parse_params
from specroute.policies.policy import seated
from specroute.policies.profile import Profile
from specroute.policies.view import RequestInfo, View


@dataclass(frozen=True)
class CrossoverParams:
    crossover: float | None = None  # from the profile when not given
    topology: Literal["shared", "partitioned"] = "shared"
    hysteresis: float = 0.0

    def __post_init__(self) -> None:
        if self.crossover is not None and self.crossover < 0:
            raise ValueError(f"crossover must be >= 0, got {self.crossover}")
        if self.hysteresis < 0:
            raise ValueError(f"hysteresis must be >= 0, got {self.hysteresis}")


class CrossoverPolicy:
    name = "crossover"

    def __init__(self, params: CrossoverParams, threshold: float) -> None:
        self.params = params
        self.threshold = threshold
        self._above: dict[str, bool] = {}  # by server or group: above the crossover last time

    @classmethod
    def build(cls, raw: Mapping[str, Any], profile: Profile | None) -> CrossoverPolicy:
        params = parse_params(cls.name, CrossoverParams, raw)
        if params.crossover is not None:
            return cls(params, params.crossover)
        if profile is None:
            raise PolicyError(
                "failed to parse the parameters of the 'crossover' policy: "
                "give crossover=N or a profile"
            )
        return cls(params, profile.crossover.threshold)

    def choose(self, request: RequestInfo, view: View) -> Decision:
        """The new request joins ``load + 1`` concurrent ones where it would run: speculate
        if that is at or below the crossover."""
        seat = view.seat(self.params.topology)
        above = self._above.get(seat.key, False)
        limit = self.threshold - (self.params.hysteresis if above else 0.0)
        above = self._above[seat.key] = seat.load + 1 > limit
        if above:
            return seated(view, seat.base, "base", "above_crossover")
        return seated(view, seat.spec, "spec", "below_crossover")

    def crossover(self) -> float | None:
        return self.threshold

    def describe(self) -> dict[str, Any]:
        return {"crossover": self.threshold} | {
            k: v for k, v in asdict(self.params).items() if k != "crossover"
        }
