"""The router's online estimator in an offline replay: fed each served request as the
router would feed it, fitted on the virtual clock, its crossover routed by in ``adopt``, and
its exploration, when it explores, turning the policy's decisions as the router's does."""

from __future__ import annotations

from dataclasses import dataclass, field

from specroute.crossing import Band
from specroute.online.estimator import Online
from specroute.online.exploration import Exploration
from specroute.policies.profile import Profile
from specroute.policies.view import LiveBands


@dataclass
class Learning:
    online: Online
    profile: Profile | None  # the profile in force: its curves stand in where few samples are
    interval: float = 5.0  # virtual seconds between fits, as ``online_interval``
    shared: bool = True  # the topology the load joined is counted in
    exploration: Exploration | None = None  # of ``online``; None: none
    # the bands the policy routes by per context bucket (None: the profile's)
    routed: tuple[tuple[Band, ...], ...] | None = None
    # each fit's time, the crossover adopted (None: the profile's) and whether it drifted
    history: list[tuple[float, float | None, bool]] = field(default_factory=list)
    # each fit's time and the live bands routed by per context bucket (() none)
    bands: list[tuple[float, LiveBands]] = field(default_factory=list)
    # each fit's time, the live crossover of its first context with its interval's ends
    # (None: none, or an open end; a bound's point is its limit), and the crossover adopted
    live: list[tuple[float, float | None, float | None, float | None, float | None]] = field(
        default_factory=list
    )

    def refit(self, now: float, accept_length: float | None = None) -> None:
        """One fit at ``now``, the speculative pool's accept length then as the router reads
        it (``View.accept_length``; None: unknown)."""
        self.online.refit(
            now, self.profile, self.shared, accept_length=accept_length, routed=self.routed
        )
        self.history.append((now, self.online.adopted, any(self.online.drift)))
        self.bands.append((now, self.online.live_bands))
        found = self.online.fits[0].crossing if self.online.fits else None
        if found is None:
            self.live.append((now, None, None, None, self.online.adopted))
        else:
            self.live.append((now, found.threshold, found.low, found.high, self.online.adopted))
