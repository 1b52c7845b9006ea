"""A policy's answer: which pool and backend, and why."""

from __future__ import annotations

from dataclasses import dataclass

from specroute.policies.view import Pool


@dataclass(frozen=True)
class Decision:
    pool: Pool
    backend: str | None  # None: no healthy backend anywhere
    reason: str  # a short word for metrics: below_crossover, above_crossover, failover, ...


class PolicyError(ValueError):
    """A policy's parameters that cannot be used; the message names the policy and key."""
