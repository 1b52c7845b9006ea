"""Baselines for comparison: ``always-spec``, ``always-base`` and ``round-robin``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specroute.policies.decision import Decision
from specroute.policies.params import parse_params
from specroute.policies.policy import pick
from specroute.policies.profile import Profile
from specroute.policies.view import POOLS, Pool, RequestInfo, View


@dataclass(frozen=True)
class NoParams:
    pass


class AlwaysPolicy:
    """Every request to one pool: what a deployment without specroute does."""

    def __init__(self, pool: Pool) -> None:
        self.pool: Pool = pool
        self.name = f"always-{pool}"

    @classmethod
    def factory(cls, pool: Pool) -> Any:
        def build(raw: Mapping[str, Any], profile: Profile | None) -> AlwaysPolicy:
            parse_params(f"always-{pool}", NoParams, raw)
            return cls(pool)

        return build

    def choose(self, request: RequestInfo, view: View) -> Decision:
        return pick(view, self.pool, "static")

    def crossover(self) -> float | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {}


class RoundRobinPolicy:
    """Alternates pools regardless of load: the control in a comparison."""

    name = "round-robin"

    def __init__(self) -> None:
        self._turn = 0

    @classmethod
    def build(cls, raw: Mapping[str, Any], profile: Profile | None) -> RoundRobinPolicy:
        parse_params(cls.name, NoParams, raw)
        return cls()

    def choose(self, request: RequestInfo, view: View) -> Decision:
        pool = POOLS[self._turn % len(POOLS)]
        self._turn += 1
        return pick(view, pool, "round_robin")

    def crossover(self) -> float | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {}
