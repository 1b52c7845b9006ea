"""Policies by name: the one place where they are registered."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, get_type_hints

from specroute.policies import params
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


# The parameters that were settings of their own (--crossover, SPECROUTE_CROSSOVER, a flat
# TOML key), before each policy's parameters came in one table; kept as deprecated spellings.
FLAT_KEYS = ("crossover", "topology", "hysteresis", "accept_max_age", "probe_share", "context")


def entry(name: str) -> Entry:
    found = REGISTRY.get(name)
    if found is None:
        raise PolicyError(f"unknown policy {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return found


def build_policy(name: str, params: Mapping[str, Any], profile: Profile | None) -> Policy:
    return entry(name).factory(params, profile)


def checked(name: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` as the policy's dataclass types it; unknown keys and bad values refused."""
    return params.checked(name, entry(name).params, raw)


def parse_spec(text: str) -> tuple[str, dict[str, str]]:
    """``NAME[:KEY=VALUE...]``: a policy and its parameters as text, checked against its
    dataclass, as ``--policy-param`` gives them too."""
    name, *items = text.strip().split(":")
    found = entry(name)  # an unknown policy first, whatever follows it
    given = params.pairs(items, f"policy {name!r}")
    params.checked(name, found.params, given)
    return name, given


def kind_of(key: str) -> str:
    """What a parameter's value must be, as the first policy taking it says (NUMBER,
    shared|partitioned): for the deprecated flat settings, one parameter each."""
    for found in REGISTRY.values():
        hints = get_type_hints(found.params)
        if key in hints:
            return params.kind(hints[key])
    raise KeyError(key)


def help_text() -> str:
    """Every policy's parameters, one line each, from their dataclasses."""
    lines = []
    for name, found in REGISTRY.items():
        rows = params.help_lines(found.params)
        lines += [f"  {name}:" + ("" if rows else " none"), *rows]
    return "\n".join(lines)
