"""Policies by name: the one place where they are registered."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from specroute.policies.acceptance_crossover import AcceptanceCrossoverPolicy, AcceptanceParams
from specroute.policies.context_crossover import ContextCrossoverParams, ContextCrossoverPolicy
from specroute.policies.crossover import CrossoverParams, CrossoverPolicy
from specroute.policies.decision import PolicyError
from specroute.policies.expected_latency import ExpectedLatencyParams, ExpectedLatencyPolicy
from specroute.policies.policy import Policy
from specroute.policies.profile import Profile
from specroute.policies.static import AlwaysPolicy, NoParams, RoundRobinPolicy

Factory = Callable[[Mapping[str, Any], Profile | None], Policy]


@dataclass(frozen=True)
class Entry:
    factory: Factory
    params: type  # the policy's frozen parameters dataclass

    def keys(self) -> frozenset[str]:
        return frozenset(f.name for f in fields(self.params))


REGISTRY: dict[str, Entry] = {
    "crossover": Entry(CrossoverPolicy.build, CrossoverParams),
    "acceptance-crossover": Entry(AcceptanceCrossoverPolicy.build, AcceptanceParams),
    "context-crossover": Entry(ContextCrossoverPolicy.build, ContextCrossoverParams),
    "expected-latency": Entry(ExpectedLatencyPolicy.build, ExpectedLatencyParams),
    "always-spec": Entry(AlwaysPolicy.factory("spec"), NoParams),
    "always-base": Entry(AlwaysPolicy.factory("base"), NoParams),
    "round-robin": Entry(RoundRobinPolicy.build, NoParams),
}


def entry(name: str) -> Entry:
    found = REGISTRY.get(name)
    if found is None:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return found


def build_policy(name: str, params: Mapping[str, Any], profile: Profile | None) -> Policy:
    return entry(name).factory(params, profile)
