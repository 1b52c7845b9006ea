"""``context-crossover``: the crossover policy with a crossover per context length.

For: traffic whose prompts differ in length. Every decode step reads the KV cache of every
request in the batch, and a verify step reads it for each draft token too, so the load
where speculation stops paying moves with the context (KV tokens) of the requests running;
a ``specroute.profile/v2`` gives the bands of load where it pays per context bucket.

Each request's context is estimated without a tokenizer, from what the router read of its
body: its prompt's bytes times the profile's ``tokens_per_byte`` (token ids as they are),
plus half its ``max_tokens`` (``RequestInfo.context``). Where it would run (the seat, as
``crossover`` finds it: the least-loaded GPU group with ``topology=shared``, the
least-loaded speculative server with ``partitioned``), the context mix is the mean context
of the requests in flight there with this one: (their KV tokens + its own) / (their number
+ 1). It speculates while the load it would join lies inside the profile's bands at that
mix, with ``hysteresis`` at every edge as ``crossover`` has it. Parameters: ``topology``
(shared) and ``hysteresis`` (0).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from specroute.crossing import Band
from specroute.policies.crossover import Hysteresis, first_top
from specroute.policies.decision import Decision, PolicyError
from specroute.policies.params import parse_params
from specroute.policies.policy import seated
from specroute.policies.profile import ContextAxis, Profile
from specroute.policies.view import UNSAID_MAX_TOKENS, RequestInfo, Seat, View, joined_context


@dataclass(frozen=True)
class ContextCrossoverParams:
    topology: Literal["shared", "partitioned"] = "shared"
    hysteresis: float = 0.0

    def __post_init__(self) -> None:
        if self.hysteresis < 0:
            raise ValueError(f"hysteresis must be >= 0, got {self.hysteresis}")


class ContextCrossoverPolicy:
    name = "context-crossover"

    def __init__(self, params: ContextCrossoverParams, axis: ContextAxis) -> None:
        self.params, self.axis = params, axis
        self._edges = Hysteresis(params.hysteresis)
        self.mix: float | None = None  # the context mix of the last decision
        self._bands: tuple[Band, ...] = ()  # the bands at that mix

    @classmethod
    def build(cls, raw: Mapping[str, Any], profile: Profile | None) -> ContextCrossoverPolicy:
        params = parse_params(cls.name, ContextCrossoverParams, raw)
        if profile is None or profile.context is None:
            given = "none was given" if profile is None else "this one has none"
            raise PolicyError(
                f"the {cls.name!r} policy needs a profile with a context axis "
                f"(specroute.profile/v2, from calibration across contexts); {given}"
            )
        return cls(params, profile.context)

    @property
    def tokens_per_byte(self) -> float:
        return self.axis.tokens_per_byte

    def choose(self, request: RequestInfo, view: View) -> Decision:
        seat = view.seat(self.params.topology)
        mix = joined_context(self._there(view, seat), request.context(self.axis.tokens_per_byte))
        bands = self.axis.bands_at(mix)
        self.mix, self._bands = mix, bands
        if self._edges.inside(seat.key, seat.load + 1, bands):
            return seated(view, seat.spec, "spec", "inside_band_at_context")
        return seated(view, seat.base, "base", "outside_band_at_context")

    def _there(self, view: View, seat: Seat) -> tuple[int, int]:
        """The router's KV tokens and requests in flight where the request would run."""
        if self.params.topology == "shared":
            return view.group_context(seat.key)
        spec = seat.spec
        return (0, 0) if spec is None else (spec.kv_tokens, spec.inflight)

    def crossover(self) -> float | None:
        """At the context mix of the last decision; None before the first."""
        return None if self.mix is None else first_top(self._bands)

    def describe(self) -> dict[str, Any]:
        buckets = [{"context": b.context, "bands": [list(band) for band in b.crossover.bands]}
                   for b in self.axis.buckets]  # fmt: skip
        return {
            "tokens_per_byte": self.axis.tokens_per_byte,
            "buckets": buckets,
            "unsaid_max_tokens": UNSAID_MAX_TOKENS,
            "context_mix": self.mix,
            "crossover": self.crossover(),
        } | asdict(self.params)
