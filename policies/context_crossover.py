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
+ 1). With ``topology=shared`` it speculates while the load it would join lies inside the
profile's bands at that mix, with ``hysteresis`` at every edge as ``crossover`` has it.

With ``topology=partitioned`` each server runs on GPUs of its own and has a load and a mix of
its own, so the bands, measured with both servers at one load, do not say where a request
is faster. When the profile's buckets carry their curves, the crossover is where the two
servers' curves cross, each read at the load and the context mix the request would join
there (as ``expected-latency`` reads them): it speculates while the speculative server,
read so, is faster than the plain one (reason ``faster_at_context``). A profile without
bucket curves keeps the band rule at the speculative server's load, spilling the rest to
the plain pool. Parameters: ``topology`` (shared) and ``hysteresis`` (0; the band rule's).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from specroute.crossing import Band, first_top
from specroute.policies.crossover import TOPOLOGY, Hysteresis, Topology
from specroute.policies.curves import context_curves
from specroute.policies.decision import Decision, PolicyError
from specroute.policies.expected_latency import ExpectedLatencyPolicy
from specroute.policies.params import parse_params
from specroute.policies.policy import seated
from specroute.policies.profile import ContextAxis, Profile
from specroute.policies.view import UNSAID_MAX_TOKENS, RequestInfo, Seat, View, joined_context


@dataclass(frozen=True)
class ContextCrossoverParams:
    topology: Topology = field(default="shared", metadata={"help": TOPOLOGY})
    hysteresis: float = field(default=0.0, metadata={"help": "as crossover's, at every edge"})

    def __post_init__(self) -> None:
        if self.hysteresis < 0:
            raise ValueError(f"hysteresis must be >= 0, got {self.hysteresis}")


class ContextCrossoverPolicy:
    name = "context-crossover"

    def __init__(
        self,
        params: ContextCrossoverParams,
        axis: ContextAxis,
        curves: ExpectedLatencyPolicy | None = None,
    ) -> None:
        self.params, self.axis = params, axis
        self._curves = curves  # partitioned, with bucket curves: where they cross
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
        curves = None
        if params.topology == "partitioned" and context_curves(profile) is not None:
            curves = ExpectedLatencyPolicy.build({"topology": "partitioned"}, profile)
        return cls(params, profile.context, curves)

    @property
    def tokens_per_byte(self) -> float:
        return self.axis.tokens_per_byte

    def choose(self, request: RequestInfo, view: View) -> Decision:
        seat = view.seat(self.params.topology)
        mix = joined_context(self._there(view, seat), request.context(self.axis.tokens_per_byte))
        bands = self.axis.bands_at(mix, view.live_bands)
        self.mix, self._bands = mix, bands
        if self._curves is not None:
            decision = self._curves.choose(request, view)
            if decision.backend is None:
                return decision
            return Decision(decision.pool, decision.backend, "faster_at_context")
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
        buckets = [
            {"context": b.context, "bands": [list(band) for band in b.crossover.bands]}
            for b in self.axis.buckets
        ]
        return {
            "tokens_per_byte": self.axis.tokens_per_byte,
            "buckets": buckets,
            "unsaid_max_tokens": UNSAID_MAX_TOKENS,
            "context_mix": self.mix,
            "crossover": self.crossover(),
            "rule": "bands" if self._curves is None else "curves",
        } | asdict(self.params)
