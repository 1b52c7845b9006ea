"""The gauges of online calibration, read at each scrape from the last fit: the live
crossover with its interval beside the profile's, the samples and median TPOT per pool and
level, drift, the samples left out as taught by another drafter and the accept length the
fit stands at, and whether routing follows the live crossover."""

from __future__ import annotations

import math
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily

from specroute.online.estimator import Online
from specroute.online.fit import LiveFit
from specroute.policies.profile import Crossover, Profile

_EDGES = ("point", "low", "high")


def online_gauges(online: Online, profile: Profile | None) -> Iterator[GaugeMetricFamily]:
    live = GaugeMetricFamily(
        "specroute_online_crossover",
        "The crossover learned from live traffic, per context bucket: edge point, or the low "
        "and high ends of its interval (an open end is absent; a bound is the point, at the "
        "edge of the levels used, with bound above or below).",
        labels=["bucket", "edge", "bound"],
    )
    profiled = GaugeMetricFamily(
        "specroute_online_profile_crossover",
        "The profile's crossover beside it, per context bucket: edge point, low or high.",
        labels=["bucket", "edge"],
    )
    samples = GaugeMetricFamily(
        "specroute_online_samples",
        "Served requests in the forgetting window, per context bucket, pool and level of load.",
        labels=["bucket", "pool", "level"],
    )
    tpot = GaugeMetricFamily(
        "specroute_online_tpot_seconds",
        "The live median time per output token, per context bucket, pool and level of load.",
        labels=["bucket", "pool", "level"],
    )
    drift = GaugeMetricFamily(
        "specroute_profile_drift",
        "1 when the live crossover, sure enough to adopt, has an interval that no longer "
        "overlaps the profile's, per context bucket.",
        labels=["bucket"],
    )
    crossovers = _profiled(profile)
    for i, (found, drifted) in enumerate(zip(online.fits, online.drift, strict=True)):
        bucket = str(i)
        _live(live, bucket, found)
        if i < len(crossovers):
            c = crossovers[i]
            ci = c.ci or (None, None)
            for edge, value in zip(_EDGES, (c.value, *ci), strict=True):
                if value is not None and math.isfinite(value):
                    profiled.add_metric([bucket, edge], value)
        for pool, rows in found.curves.items():
            for level in rows:
                if level.samples:
                    labels = [bucket, pool, f"{level.level:g}"]
                    samples.add_metric(labels, level.samples)
                    if level.median is not None:
                        tpot.add_metric(labels, level.median)
        drift.add_metric([bucket], int(drifted))
    yield from (live, profiled, samples, tpot, drift)
    accept = GaugeMetricFamily(
        "specroute_online_fit_accept_length",
        "The speculative servers' accept length the last fit stands at (absent: unknown): "
        "its speculative samples further than online_accept_tolerance from it were left out.",
    )
    if online.accept_length is not None:
        accept.add_metric([], online.accept_length)
    left_out = GaugeMetricFamily(
        "specroute_online_samples_left_out",
        "Samples in the forgetting window that the last fit left out, by reason: "
        "other_drafter (a speculative sample whose accept length is further than "
        "online_accept_tolerance from the speculative servers' now; kept, it counts again "
        "if acceptance comes back); beside_other_pool (taken beside the other pool's requests "
        "on the same GPUs, their steps taking turns: not what a level of either pool alone "
        "means).",
        labels=["reason"],
    )
    left_out.add_metric(["other_drafter"], online.left_out)
    left_out.add_metric(["beside_other_pool"], online.beside)
    yield from (accept, left_out)
    yield GaugeMetricFamily(
        "specroute_online_adopted",
        "1 when the router routes by a live crossover or live bands (online=adopt, sure "
        "enough; in one context bucket at least); 0 when by the profile's.",
        value=int(any(bands is not None for bands in online.live_bands)),
    )


def _live(family: GaugeMetricFamily, bucket: str, found: LiveFit) -> None:
    c = found.crossing
    if c is None:
        return
    if c.at is None:
        if c.limit is not None:
            family.add_metric([bucket, "point", c.bound or ""], c.limit)
        return
    for edge, value in zip(_EDGES, (c.at, c.low, c.high), strict=True):
        if value is not None:
            family.add_metric([bucket, edge, ""], value)


def _profiled(profile: Profile | None) -> tuple[Crossover, ...]:
    if profile is None:
        return ()
    if profile.context is not None:
        return tuple(b.crossover for b in profile.context.buckets)
    return (profile.crossover,)
