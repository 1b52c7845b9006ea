"""Where inside the chosen pool a request runs: the policy's pick, or the server most
likely to hold its prompt's beginning in its prefix cache.

A policy chooses the pool (speculative or plain) and, in it, the least-loaded server.
``prefix-affinity`` then moves the request, within that pool and GPU group, to the server
that rendezvous hashing (highest random weight) gives the first ``prefix_bytes`` of its
prompt: requests that begin alike (a system prompt, a conversation's earlier turns) meet
on one server, whose radix cache holds that beginning, and when a server leaves only its
own prompts move. It keeps the policy's pick when the request has no prompt, and goes to
the least-loaded server when the hashed one is busier than it by more than both
thresholds, as SGLang's gateway does in its ``cache_aware`` policy. A server that is
ejected, whose reported running requests have reached its cap, or (in the speculative
pool) whose load has reached the crossover in force is never chosen by its hash: the
request then joins no server busier than the crossover allows, as with least load.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from specroute.policies.decision import Decision, PolicyError
from specroute.policies.view import BackendView, RequestInfo, View

PlacementName = Literal["least-load", "prefix-affinity"]
# why a request ran where it did, for ``specroute_placements``
Placed = Literal["least_load", "affinity", "balance", "full", "no_prefix"]


class Placement(Protocol):
    @property
    def name(self) -> PlacementName: ...

    @property
    def prefix_bytes(self) -> int:
        """How much of the prompt the router reads for it; 0: none."""
        ...

    def place(
        self, decision: Decision, request: RequestInfo, view: View, ceiling: float | None = None
    ) -> tuple[Decision, Placed]:
        """Synchronous and free of I/O, like a policy: the backend within the decision's
        pool, and why. ``ceiling``: the load a server must be below to be chosen for any
        other reason than least load (the crossover, for the speculative pool)."""
        ...


@dataclass(frozen=True)
class LeastLoad:
    """The policy's own pick: the least-loaded healthy server of the pool."""

    name: PlacementName = "least-load"
    prefix_bytes: int = 0

    def place(
        self, decision: Decision, request: RequestInfo, view: View, ceiling: float | None = None
    ) -> tuple[Decision, Placed]:
        return decision, "least_load"


@dataclass(frozen=True)
class PrefixAffinity:
    name: PlacementName = "prefix-affinity"
    prefix_bytes: int = 1024
    balance_abs: int = 16  # the hashed server may be this much busier than the least ...
    balance_rel: float = 1.5  # ... or this many times as busy, but not both

    def __post_init__(self) -> None:
        if self.prefix_bytes < 1:
            raise PolicyError(
                f"placement prefix-affinity: prefix_bytes must be >= 1, got {self.prefix_bytes}"
            )
        if self.balance_abs < 0 or self.balance_rel < 1:
            raise PolicyError(
                "placement prefix-affinity: balance_abs must be >= 0 and balance_rel >= 1, got "
                f"{self.balance_abs} and {self.balance_rel}"
            )

    def place(
        self, decision: Decision, request: RequestInfo, view: View, ceiling: float | None = None
    ) -> tuple[Decision, Placed]:
        if decision.backend is None:
            return decision, "least_load"
        if not request.prefix:
            return decision, "no_prefix"
        chosen = next((b for b in view.backends if b.name == decision.backend), None)
        if chosen is None:
            return decision, "least_load"
        source = view.source
        # the prefix's homes in order: one ejected hands its prefixes on to their next home
        homes = [b for b in view.healthy(decision.pool) if b.group == chosen.group]
        target = max(homes, key=lambda b: _weight(request.prefix, b.name), default=chosen)
        load = target.load(source)
        if _saturated(target, view) or (ceiling is not None and load >= ceiling):
            return decision, "full"  # the policy's least-loaded pick: no busier than allowed
        low = chosen.load(source)
        if load - low > self.balance_abs and load > low * self.balance_rel:
            return decision, "balance"
        return _moved(decision, target), "affinity"


def _saturated(b: BackendView, view: View) -> bool:
    cap = b.max_running_requests
    return cap is not None and b.load(view.source) >= cap


def _weight(prefix: bytes, name: str) -> int:
    """The server's random weight for this prefix: the same on every router worker and
    replica, and after a restart (Python's own ``hash`` of bytes is salted per process)."""
    digest = hashlib.blake2b(name.encode() + b"\0" + prefix, digest_size=8).digest()
    return int.from_bytes(digest, "big")


def _moved(decision: Decision, to: BackendView) -> Decision:
    if to.name == decision.backend:
        return decision
    return Decision(decision.pool, to.name, decision.reason)


def _least_load(prefix_bytes: int, balance_abs: int, balance_rel: float) -> Placement:
    return LeastLoad()


def _prefix_affinity(prefix_bytes: int, balance_abs: int, balance_rel: float) -> Placement:
    return PrefixAffinity(
        prefix_bytes=prefix_bytes, balance_abs=balance_abs, balance_rel=balance_rel
    )


PLACEMENTS: dict[PlacementName, Callable[[int, int, float], Placement]] = {
    "least-load": _least_load,
    "prefix-affinity": _prefix_affinity,
}


def placement(
    name: PlacementName, *, prefix_bytes: int, balance_abs: int, balance_rel: float
) -> Placement:
    """A placement by name, with the parameters that those who take them take."""
    return PLACEMENTS[name](prefix_bytes, balance_abs, balance_rel)
