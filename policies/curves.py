"""A profile's measured curves: each backend's median time per output token against
concurrency, a power law between levels (log time linear in log concurrency) and extended
past the last level along the last segment. What ``expected-latency`` and the
acceptance-aware crossover predict with; with a ``v2`` profile's curves per context bucket,
``expected-latency`` predicts at a context too.

Power laws because then the margin of two curves (the log of their ratio) is linear in log
concurrency between levels, the rule of the crossing finder: the crossover read from the
curves is the profile's own, and comparing two curves at a load agrees with it exactly."""

from __future__ import annotations

import math
from bisect import bisect_left
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from specroute.crossing import Band, bands, crossing, log_margin
from specroute.policies.profile import Profile, ProfileError
from specroute.policies.view import POOLS, Pool


@dataclass(frozen=True)
class Curve:
    levels: tuple[float, ...]
    values: tuple[float, ...]  # seconds per output token at each level

    def at(self, concurrency: float) -> float:
        """Below the first level, the first value; at a level, its value exactly."""
        c = max(concurrency, self.levels[0])
        if len(self.levels) == 1:
            return self.values[0] * c / self.levels[0]
        i = bisect_left(self.levels, c, 1, len(self.levels) - 1)
        (x0, x1), (y0, y1) = self.levels[i - 1 : i + 1], self.values[i - 1 : i + 1]
        if c == x1:
            return y1
        return y0 * math.pow(y1 / y0, math.log(c / x0) / math.log(x1 / x0))


@dataclass(frozen=True)
class Curves:
    tpot: dict[Pool, Curve]
    max_running: dict[Pool, int | None]
    accept_length: float | None  # what the speculative curve was measured at

    def crossover(self, accept_scale: float = 1.0) -> float:
        """Where speculation's TPOT, scaled by ``accept_scale`` (measured over live accept
        length), stops being below the plain server's: the crossing finder on the levels.
        0 when speculation loses from the first level; the last level when it still wins
        there, since past it nothing was measured (the router does not guess)."""
        levels, margin = self._margin(accept_scale)
        found = crossing(levels, margin)
        if found.at is not None:
            return found.at
        return levels[-1] if found.bound == "above" else 0.0

    def bands(self, accept_scale: float = 1.0) -> tuple[Band, ...]:
        """Every span of load where speculation's scaled TPOT is below the plain server's,
        by the rule the profile's bands follow; the first band's top is ``crossover``
        when speculation pays from the first level."""
        return tuple(bands(*self._margin(accept_scale)))

    def _margin(self, accept_scale: float) -> tuple[list[float], list[float]]:
        spec, base = self.tpot["spec"], self.tpot["base"]
        levels = sorted(set(spec.levels) | set(base.levels))
        spec_times = [spec.at(c) * accept_scale for c in levels]
        return levels, log_margin(spec_times, [base.at(c) for c in levels])


def curves(profile: Profile) -> Curves:
    levels = profile.raw.get("levels")
    if not isinstance(levels, list) or not levels:
        raise ProfileError("this policy needs a profile with measured 'levels'")
    try:
        rows = sorted(levels, key=lambda r: r["concurrency"])
        times = {pool: [r[pool]["tpot_ms"]["median"] for r in rows] for pool in POOLS}
        concurrency = [r["concurrency"] for r in rows]
    except (KeyError, TypeError) as exc:
        raise ProfileError(f"a profile level lacks {exc}: expected tpot_ms.median") from None
    tpot = _checked(concurrency, times, "profile levels")
    servers: dict[str, Any] = profile.raw.get("servers") or {}
    return Curves(
        tpot,
        {pool: (servers.get(pool) or {}).get("max_running_requests") for pool in POOLS},
        profile.accept_length,
    )


@dataclass(frozen=True)
class ContextCurves:
    """Each context bucket's curves, ascending in context (mean KV tokens per request)."""

    contexts: tuple[float, ...]
    tpot: tuple[dict[Pool, Curve], ...]

    def at(self, pool: Pool, load: float, context: float) -> float:
        """Seconds per output token at ``load`` requests of mean ``context``: each bucket's
        curve at that load, linear in context between the two buckets around it (a step
        reads every request's KV cache, so its time grows linearly with their context),
        the end bucket's beyond."""
        contexts = self.contexts
        if context <= contexts[0]:
            return self.tpot[0][pool].at(load)
        if context >= contexts[-1]:
            return self.tpot[-1][pool].at(load)
        hi = bisect_left(contexts, context)
        low, high = self.tpot[hi - 1][pool].at(load), self.tpot[hi][pool].at(load)
        share = (context - contexts[hi - 1]) / (contexts[hi] - contexts[hi - 1])
        return low + (high - low) * share


def context_curves(profile: Profile) -> ContextCurves | None:
    """A ``v2`` profile's bucket curves: each bucket's ``tpot_ms`` (median milliseconds per
    output token of each backend, at each of the bucket's ``levels``); None for a profile
    without a context axis, or whose buckets carry no curves (written before they did)."""
    buckets = (profile.raw.get("context") or {}).get("buckets")
    if profile.context is None or not isinstance(buckets, list):
        return None
    if not any(isinstance(b, dict) and "tpot_ms" in b for b in buckets):
        return None
    tpot: list[dict[Pool, Curve]] = []
    for i, bucket in enumerate(buckets):
        where = f"context.buckets[{i}]"
        try:
            times = {pool: list(bucket["tpot_ms"][pool]) for pool in POOLS}
            concurrency = list(bucket["levels"])
        except (KeyError, TypeError) as exc:
            raise ProfileError(
                f"{where} needs levels and tpot_ms with spec and base lists: {exc}"
            ) from None
        tpot.append(_checked(concurrency, times, where))
    return ContextCurves(tuple(b.context for b in profile.context.buckets), tuple(tpot))


def _checked(concurrency: list[Any], times: dict[Pool, list[Any]], where: str) -> dict[Pool, Curve]:
    """Each backend's curve over ``concurrency``, from its median milliseconds per output
    token at each level: the levels ascending and positive, one positive time per level."""
    try:
        levels = tuple(float(c) for c in concurrency)
        tpot = {pool: Curve(levels, tuple(ms / 1000.0 for ms in times[pool])) for pool in POOLS}
    except (TypeError, ValueError) as exc:
        raise ProfileError(f"{where}: levels and times must be numbers: {exc}") from None
    if not levels or levels[0] <= 0 or any(b <= a for a, b in pairwise(levels)):
        raise ProfileError(f"{where} must be distinct and positive, got {levels}")
    if any(len(c.values) != len(levels) or min(c.values) <= 0 for c in tpot.values()):
        raise ProfileError(f"{where}: tpot_ms must be one positive time per level")
    return tpot
