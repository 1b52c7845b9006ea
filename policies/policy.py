"""The one policy interface, and the pick every policy ends with."""

from __future__ import annotations

from typing import Any, Protocol

from specroute.policies.decision import Decision
from specroute.policies.view import POOLS, BackendView, Pool, RequestInfo, View


class Policy(Protocol):
    name: str

    def choose(self, request: RequestInfo, view: View) -> Decision:
        """Synchronous and free of I/O: reads the snapshot, returns the choice."""
        ...

    def describe(self) -> dict[str, Any]:
        """The parameters in force, for ``/router/status``."""
        ...

    def crossover(self) -> float | None:
        """The crossover in force, for ``specroute_crossover`` (read at every decision, so
        cheap); None for a policy without one."""
        ...


def pick(view: View, pool: Pool, reason: str) -> Decision:
    """The least-loaded healthy backend of ``pool``, else of the other pool (``failover``)."""
    backend = view.least_loaded(pool)
    if backend is not None:
        return Decision(pool, backend.name, reason)
    other: Pool = POOLS[1] if pool == POOLS[0] else POOLS[0]
    backend = view.least_loaded(other)
    if backend is not None:
        return Decision(other, backend.name, "failover")
    return Decision(pool, None, "no_healthy_backend")


def seated(view: View, backend: BackendView | None, pool: Pool, reason: str) -> Decision:
    """``backend`` of ``pool`` where the request was seated, else the pool's pick."""
    if backend is not None:
        return Decision(pool, backend.name, reason)
    return pick(view, pool, reason)
