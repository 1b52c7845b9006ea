"""Policies by name: the one place where they are registered."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from policies.crossover import CrossoverPolicy
from policies.decision import PolicyError
from policies.policy import Policy
from policies.profile import Profile
from policies.static import AlwaysPolicy, RoundRobinPolicy

Factory = Callable[[Mapping[str, Any], Profile | None], Policy]

REGISTRY: dict[str, Factory] = {
    "crossover": CrossoverPolicy.build,
    "always-spec": AlwaysPolicy.factory("spec"),
    "always-base": AlwaysPolicy.factory("base"),
    "round-robin": RoundRobinPolicy.build,
}


def build_policy(name: str, params: Mapping[str, Any], profile: Profile | None) -> Policy:
    factory = REGISTRY.get(name)
    if factory is None:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return factory(params, profile)
