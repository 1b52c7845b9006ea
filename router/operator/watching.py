"""What the operator's read-only endpoints and the gauges see of the router, and nothing
else of its state: the view routed by (followed up to what the other workers published),
the roster and the board, the admission quota, the policy in force, the live fits, and the
settings that say how old a reading may be and over which window the fits were made."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specroute.online.estimator import Online
from specroute.policies.view import View
from specroute.router.admission.quota import Quota
from specroute.router.backends.backend import Backend
from specroute.router.backends.roster import Roster
from specroute.router.policy_in_force import PolicyInForce
from specroute.router.settings.online import OnlineSettings
from specroute.router.workers.board import Board


@dataclass(frozen=True)
class Watching:
    view: Callable[[], View]  # the state's: what the other workers published, applied first
    roster: Roster
    board: Board
    quota: Quota
    in_force: PolicyInForce
    online: Online
    stale_after: float  # seconds a backend's reading stands (settings.health)
    online_settings: OnlineSettings

    @property
    def backends(self) -> list[Backend]:
        return self.roster.backends
