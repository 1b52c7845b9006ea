"""A profile's measured curves: each backend's median time per output token against
concurrency, interpolated in log concurrency and extended past the last level along the
last segment. What ``expected-latency`` and the acceptance-aware crossover predict with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from specroute.policies.profile import Profile, ProfileError
from specroute.policies.view import POOLS, Pool


@dataclass(frozen=True)
class Curve:
    levels: tuple[float, ...]
    values: tuple[float, ...]  # seconds per output token at each level

    def at(self, concurrency: float) -> float:
        c = max(concurrency, self.levels[0])
        if len(self.levels) == 1:
            return self.values[0] * c / self.levels[0]
        i = next(
            (k for k in range(1, len(self.levels)) if self.levels[k] >= c), len(self.levels) - 1
        )
        x0, x1 = math.log(self.levels[i - 1]), math.log(self.levels[i])
        y0, y1 = self.values[i - 1], self.values[i]
        return y0 + (y1 - y0) * (math.log(c) - x0) / (x1 - x0)


@dataclass(frozen=True)
class Curves:
    tpot: dict[Pool, Curve]
    max_running: dict[Pool, int | None]
    accept_length: float | None  # what the speculative curve was measured at

    def crossover(self, accept_scale: float = 1.0, limit: float = 4096) -> float:
        """Where speculation's TPOT, scaled by ``accept_scale`` (measured over live accept
        length), stops being below the plain server's, found on a fine log grid."""
        c, step = 1.0, 1.02
        if self.tpot["spec"].at(c) * accept_scale >= self.tpot["base"].at(c):
            return 0.0
        while c < limit:
            nxt = c * step
            if self.tpot["spec"].at(nxt) * accept_scale >= self.tpot["base"].at(nxt):
                return nxt
            c = nxt
        return math.inf


def curves(profile: Profile) -> Curves:
    levels = profile.raw.get("levels")
    if not isinstance(levels, list) or not levels:
        raise ProfileError("this policy needs a profile with measured 'levels'")
    try:
        rows = sorted(levels, key=lambda r: r["concurrency"])
        tpot = {
            pool: Curve(tuple(float(r["concurrency"]) for r in rows),
                        tuple(r[pool]["tpot_ms"]["median"] / 1000.0 for r in rows))
            for pool in POOLS
        }  # fmt: skip
    except (KeyError, TypeError) as exc:
        raise ProfileError(f"a profile level lacks {exc}: expected tpot_ms.median") from None
    servers: dict[str, Any] = profile.raw.get("servers") or {}
    accept = (profile.raw.get("acceptance") or {}).get("mean_accept_length")
    return Curves(
        tpot,
        {pool: (servers.get(pool) or {}).get("max_running_requests") for pool in POOLS},
        float(accept) if isinstance(accept, (int, float)) else None,
    )
