"""What every background task uses of the router's state: its settings, its counters, the
servers routed between and the policy in force (``Held``; each task's protocol adds what it
alone uses)."""

from __future__ import annotations

from typing import Protocol

from specroute.router.backends.roster import Roster
from specroute.router.metrics import RouterMetrics
from specroute.router.policy_in_force import PolicyInForce
from specroute.router.settings import RouterSettings


class Held(Protocol):
    @property
    def settings(self) -> RouterSettings: ...
    @property
    def metrics(self) -> RouterMetrics: ...
    @property
    def roster(self) -> Roster: ...
    @property
    def in_force(self) -> PolicyInForce: ...
