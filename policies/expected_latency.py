"""``expected-latency``: each request where its predicted time per output token is lowest.

For: the partitioned topology (each pool on its own GPUs), where a threshold leaves one
pool idle or overfull. The prediction reads the profile's curves at the load the request
would join on each candidate backend (the least loaded of each pool, live running and
queued per ``concurrency_source``); past a backend's ``max_running_requests`` the request
also waits for a slot, which stretches its time per token by load over capacity.
``topology=shared`` (each speculative server shares its GPUs with a plain one) reads both
curves at the load of the least-loaded GPU group instead, and picks within it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, Literal

from specroute.policies.curves import Curves, curves
from specroute.policies.decision import Decision, PolicyError
from specroute.policies.params import parse_params
from specroute.policies.profile import Profile
from specroute.policies.view import POOLS, RequestInfo, View


@dataclass(frozen=True)
class ExpectedLatencyParams:
    topology: Literal["shared", "partitioned"] = "partitioned"


class ExpectedLatencyPolicy:
    name = "expected-latency"

    def __init__(self, params: ExpectedLatencyParams, curves: Curves) -> None:
        self.params, self.curves = params, curves
        self._crossover = curves.crossover()  # shown, not routed by

    @classmethod
    def build(cls, raw: Mapping[str, Any], profile: Profile | None) -> ExpectedLatencyPolicy:
        params = parse_params(cls.name, ExpectedLatencyParams, raw)
        if profile is None:
            raise PolicyError("the 'expected-latency' policy needs a profile with curves")
        return cls(params, curves(profile))

    def predicted_tpot(self, pool: str, load: int, capacity: int | None) -> float:
        curve = self.curves.tpot["spec" if pool == "spec" else "base"]
        if capacity is not None and load > capacity:
            return curve.at(capacity) * load / capacity
        return curve.at(load)

    def choose(self, request: RequestInfo, view: View) -> Decision:
        best: tuple[float, Decision] | None = None
        shared = self.params.topology == "shared"
        seat = view.seat("shared") if shared else None
        for pool in POOLS:
            backend = view.least_loaded(pool) if seat is None else getattr(seat, pool)
            if backend is None:
                continue
            load = (backend.load(view.source) if seat is None else seat.load) + 1
            capacity = backend.max_running_requests or self.curves.max_running[pool]
            tpot = self.predicted_tpot(pool, load, capacity)
            if best is None or tpot < best[0]:
                best = (tpot, Decision(pool, backend.name, "expected_latency"))
        if best is None:
            return Decision("base", None, "no_healthy_backend")
        return best[1]

    def crossover(self) -> float | None:
        return self._crossover

    def describe(self) -> dict[str, Any]:
        return asdict(self.params) | {"crossover": self._crossover}
