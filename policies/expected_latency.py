"""``expected-latency``: each request where its predicted time per output token is lowest.

For: the partitioned topology (each pool on its own GPUs), where a threshold leaves one
pool idle or overfull. The prediction reads the profile's curves at the load the request
would join on each candidate backend (the least loaded of each pool, live running and
queued per ``concurrency_source``); past a backend's ``max_running_requests`` the request
also waits for a slot, which stretches its time per token by load over capacity.
``topology=shared`` (each speculative server shares its GPUs with a plain one) reads both
curves at the load of the least-loaded GPU group instead, and picks within it.

With a ``specroute.profile/v2`` whose buckets carry their curves, it reads them at the
context mix the request would join there too (``context=auto``, the default): the mean
estimated context of the requests in flight on that server (with ``topology=shared``, on
the GPU group) and of this one, linear in context between the buckets around it: a step's
time grows with the KV cache of every request in it, and each bucket's curves were measured
with its own prompts' prefills in them. ``context=off`` reads the top-level curves only, as
a v1 profile has it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from specroute.policies.crossover import TOPOLOGY, Topology
from specroute.policies.curves import ContextCurves, Curves, context_curves, curves
from specroute.policies.decision import Decision, PolicyError
from specroute.policies.params import parse_params
from specroute.policies.profile import Profile
from specroute.policies.view import POOLS, TOKENS_PER_BYTE, Pool, RequestInfo, View, joined_context


@dataclass(frozen=True)
class ExpectedLatencyParams:
    topology: Topology = field(default="partitioned", metadata={"help": TOPOLOGY})
    context: Literal["auto", "off"] = field(
        default="auto",
        metadata={
            "help": "auto: read the curves at the context mix a request would join, when the "
            "profile has curves per context; off: the top-level curves only"
        },
    )


class ExpectedLatencyPolicy:
    name = "expected-latency"

    def __init__(
        self,
        params: ExpectedLatencyParams,
        curves: Curves,
        by_context: ContextCurves | None = None,
        tokens_per_byte: float = TOKENS_PER_BYTE,
    ) -> None:
        self.params, self.curves, self.by_context = params, curves, by_context
        self.tokens_per_byte = tokens_per_byte  # the profile's, when it routes by context
        self._crossover = curves.crossover()  # shown, not routed by

    @classmethod
    def build(cls, raw: Mapping[str, Any], profile: Profile | None) -> ExpectedLatencyPolicy:
        params = parse_params(cls.name, ExpectedLatencyParams, raw)
        if profile is None:
            raise PolicyError("the 'expected-latency' policy needs a profile with curves")
        by_context = None if params.context == "off" else context_curves(profile)
        if by_context is None or profile.context is None:
            return cls(params, curves(profile))
        return cls(params, curves(profile), by_context, profile.context.tokens_per_byte)

    def predicted_tpot(
        self, pool: Pool, load: int, capacity: int | None, context: float | None = None
    ) -> float:
        """Past ``capacity`` the request waits for a slot as well; at ``context`` (mean KV
        tokens) when the profile has curves per context."""
        slots = load if capacity is None else min(load, capacity)
        if context is None or self.by_context is None:
            tpot = self.curves.tpot[pool].at(slots)
        else:
            tpot = self.by_context.at(pool, slots, context)
        return tpot * load / slots

    def choose(self, request: RequestInfo, view: View) -> Decision:
        best: tuple[float, Decision] | None = None
        seat = view.seat("shared") if self.params.topology == "shared" else None
        own = None if self.by_context is None else request.context(self.tokens_per_byte)
        # on a GPU group both servers' requests make one mix; else each server's its own
        group_mix = (
            None
            if own is None or seat is None
            else joined_context(view.group_context(seat.key), own)
        )
        for pool in POOLS:
            backend = view.least_loaded(pool) if seat is None else getattr(seat, pool)
            if backend is None:
                continue
            load = (backend.load(view.source) if seat is None else seat.load) + 1
            capacity = backend.max_running_requests or self.curves.max_running[pool]
            mix = group_mix
            if own is not None and seat is None:
                mix = joined_context((backend.kv_tokens, backend.inflight), own)
            tpot = self.predicted_tpot(pool, load, capacity, mix)
            if best is None or tpot < best[0]:
                best = (tpot, Decision(pool, backend.name, "expected_latency"))
        if best is None:
            return Decision("base", None, "no_healthy_backend")
        return best[1]

    def crossover(self) -> float | None:
        return self._crossover

    def describe(self) -> dict[str, Any]:
        by_context = None if self.by_context is None else list(self.by_context.contexts)
        return asdict(self.params) | {"crossover": self._crossover, "curve_contexts": by_context}
