"""A profile from production: the router's live fits written as a ``specroute.profile``
document that ``serve --profile`` loads as it does a calibrated one.

A pure function of ``Online`` (its fits, mode, window and sureness rule), the profile in
force (its context axis and the values that stood in where a pool was seen too seldom) and
what the router serves, so that it reads the same however the samples came to the fit.

What it writes is what the fit found, by the rule the router fits by: the crossover and its
interval are the live fit's (``router.online_fit``), and the levels are those its crossing
was taken at, where both pools have a value. A pool's level with fewer live samples than the
fit counts with took the profile's value there, and says so (``"from": "profile"``). It
never writes half a profile: with no crossover that stands on live samples (in any context
bucket), it refuses and says how many samples it has.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specroute.crossing import CONFIDENCE
from specroute.online.estimator import Online, OnlineMode, Sureness, profiled
from specroute.online.fit import REPLICATES, Known, Level, LiveCrossing, LiveFit
from specroute.online.samples import BESIDE_LIMIT
from specroute.policies.curves import context_curves, curves
from specroute.policies.profile import SCHEMA, SCHEMA_V2, Profile, parse_profile
from specroute.policies.view import POOLS, Pool

RULE = (
    "the live fit: each level's value is the median TPOT of the requests the router served "
    "there (a pool's level with too few takes the profile's value, as its 'from' says); the "
    "crossover is the one crossing finder on the log ratio of the two curves, and its "
    "interval the central 95% of the bootstrap replicates' crossings, each end out to the "
    "level past it"
)


class LiveProfileRefused(ValueError):
    """Why no profile can be written from the live fits now: the router answers 409."""


@dataclass(frozen=True)
class Serving:
    """What the router serves, as the profile records it: each pool's backends, their
    smallest reported batch (``max_running_requests``) and the speculative servers' live
    accept length, when known."""

    backends: dict[Pool, tuple[str, ...]]
    max_running: dict[Pool, int | None]
    accept_length: float | None


def live_profile(
    online: Online,
    profile: Profile | None,
    serving: Serving,
    now: float,
    created: str,
    exploring: bool = True,
) -> dict[str, Any]:
    """The profile document of ``online``'s fits; ``now``: monotonic seconds (the fit's
    age), ``created``: the wall-clock time to stamp it with (ISO 8601); ``exploring``:
    whether exploration runs (what a refusal advises). Raises ``LiveProfileRefused`` when
    there is none to write yet."""
    fits = _ready(online, profile, exploring)
    known = [profiled(profile, f.context) for f in fits]
    first = fits[0]
    document: dict[str, Any] = {
        "schema": SCHEMA,
        "created": created,
        "crossover": _crossover(_crossing(first), online.sureness),
        "levels": _rows(first, known[0]),
        "acceptance": _acceptance(serving.accept_length, profile),
        "servers": {
            pool: {
                "backends": list(serving.backends[pool]),
                "max_running_requests": serving.max_running[pool],
            }
            for pool in POOLS
        },
        "measurement": _measurement(online, fits, profile, now),
    }
    axis = None if profile is None else profile.context
    if axis is not None:
        document["schema"] = SCHEMA_V2
        document["context"] = {
            "tokens_per_byte": axis.tokens_per_byte,
            "buckets": [_bucket(f, k, online.sureness) for f, k in zip(fits, known, strict=True)],
        }
    readback = parse_profile(document)  # fails closed: never a document that does not read
    curves(readback)
    context_curves(readback)
    return document


def _ready(online: Online, profile: Profile | None, exploring: bool) -> tuple[LiveFit, ...]:
    """The fits, once each has a crossover that stands on live samples."""
    if online.mode is OnlineMode.OFF:
        raise LiveProfileRefused(
            "Online calibration is off (--online off): the router records no samples to "
            "write a profile from. Serve with --online observe."
        )
    kept = online.kept()  # with several workers, the leader's: every worker has its fit
    if not online.fits:
        raise LiveProfileRefused(
            f"No live fit yet: the first comes --online-interval seconds after the start "
            f"({kept} samples kept so far)."
        )
    fits = online.fits
    axis = None if profile is None else profile.context
    wanted = [None] if axis is None else [b.context for b in axis.buckets]
    if [f.context for f in fits] != wanted:
        raise LiveProfileRefused(
            "The profile in force changed since the last fit: ask again after the next one "
            "(--online-interval)."
        )
    short = [f for f in fits if _crossing(f) is None]
    if short:
        raise LiveProfileRefused(_too_few(short, len(fits) > 1, exploring))
    return fits


def _crossing(fit: LiveFit) -> LiveCrossing | None:
    """The fit's crossover if it stands on live samples: a pool counted live at a level
    around it (``near``), not the profile's own margin alone."""
    found = fit.crossing
    return found if found is not None and found.near > 0 else None


def _too_few(short: list[LiveFit], bucketed: bool, exploring: bool) -> str:
    """Why there is no live crossover yet: the samples each fit counted, and the levels
    where each pool has enough of them; how a pool comes to be seen where it is not."""
    need = short[0].min_samples
    counts = []
    for f in short:
        pools = ", ".join(
            f"{p} {sum(lvl.samples for lvl in f.curves[p])} ({_measured(f.curves[p], need)})"
            for p in POOLS
        )
        where = f"context {f.context:g}: " if bucketed and f.context is not None else ""
        counts.append(f"{where}{f.samples} samples: {pools}")
    sent = (
        "exploration (--online-explore-share) sends turns of requests to the pool the "
        "policy does not choose near the crossover"
        if exploring
        else "exploration is off (--online-explore-share 0), so each pool is seen only where "
        "the policy sends it: turn it on"
    )
    return (
        f"No live crossover yet: the last fit counted {'; '.join(counts)}, and no level "
        f"around a crossover has {need} live samples of both pools (--online-min-samples; "
        "a crossover is never fitted past the levels where both were seen). A pool is "
        f"learned only at the loads it is sent: {sent}; serve more streamed traffic at "
        "those loads, then ask again."
    )


def _measured(levels: tuple[Level, ...], need: int) -> str:
    """The levels where a pool has ``need`` live samples, in words."""
    found = [lvl.level for lvl in levels if lvl.samples >= need]
    if not found:
        return f"no level with {need}"
    said = ", ".join(f"{level:g}" for level in found)
    return f"{need} or more at level{'s' if len(found) > 1 else ''} {said} only"


def _crossover(found: LiveCrossing | None, sureness: Sureness) -> dict[str, Any]:
    """The live crossover in a profile's form (``profiler.analysis``'s): the value
    unrounded, an open end of the interval null and ``ci_open`` saying which."""
    assert found is not None  # _ready let no fit without one through
    common = {
        "metric": "tpot",
        "source": "live",
        "rule": RULE,
        "levels": list(found.levels),
        "samples_near": found.near,
        "sure": sureness.sure(found, holding=False),
    }
    if found.edges:  # bands: each edge with its interval, the first fall as the crossover
        edges = [
            {"at": e.at, "direction": e.direction, "ci": [e.low, e.high], "samples_near": e.near}
            for e in found.edges
        ]
        banded = {"bands": [list(b) for b in found.bands], "edges": edges}
        banded |= {"replicates_agreeing": round(found.beyond, 4)}
        if found.paid_first:
            fall = found.edges[0]
            return {"value": fall.at, "ci": [fall.low, fall.high]} | banded | common
        first = found.levels[0]
        return {"value": None, "ci": None, "bound": "below", "limit": first} | banded | common
    if found.at is None:
        beyond = round(found.beyond, 4)
        bound = {"value": None, "ci": None, "bound": found.bound, "limit": found.limit}
        return bound | {"replicates_agreeing": beyond} | common
    crossover: dict[str, Any] = {
        "value": found.at,
        "ci": [found.low, found.high],
        "confidence": CONFIDENCE,
    }
    opened = {(True, True): "both", (True, False): "below", (False, True): "above"}
    side = opened.get((found.low is None, found.high is None))
    if side is not None:
        crossover["ci_open"] = side
    return crossover | common


def _rows(fit: LiveFit, known: Known | None) -> list[dict[str, Any]]:
    """The levels the crossing was taken at, each pool's value there and where it came
    from."""
    found = _crossing(fit)
    assert found is not None
    return [
        {"concurrency": _count(level)}
        | {pool: _cell(pool, _level(fit, pool, level), fit.min_samples, known) for pool in POOLS}
        for level in found.levels
    ]


def _level(fit: LiveFit, pool: Pool, level: float) -> Level:
    return next(row for row in fit.curves[pool] if row.level == level)


def _cell(pool: Pool, live: Level, min_samples: int, known: Known | None) -> dict[str, Any]:
    """One pool at one level: live (its median TPOT and interval, ms), or the profile's
    value where it had fewer live samples than the fit counts with."""
    measured = None
    if live.median is not None and live.low is not None and live.high is not None:
        measured = {"median": live.median * 1000, "ci": [live.low * 1000, live.high * 1000]}
    if live.samples >= min_samples and measured is not None:
        return {"from": "live", "requests": live.samples, "tpot_ms": measured}
    value = None if known is None else known(pool, live.level)
    if value is None:  # the fit had it from a profile no longer in force
        raise LiveProfileRefused(
            "The profile in force changed since the last fit: ask again after the next one "
            "(--online-interval)."
        )
    cell: dict[str, Any] = {"from": "profile", "requests": live.samples}
    return cell | {"tpot_ms": {"median": value * 1000, "ci": None}, "live_tpot_ms": measured}


def _bucket(fit: LiveFit, known: Known | None, sureness: Sureness) -> dict[str, Any]:
    """One context bucket: what ``policies.profile`` and ``policies.curves`` read of a
    calibrated one, and where each value came from."""
    rows = _rows(fit, known)
    assert fit.context is not None
    return {
        "context": fit.context,
        "crossover": _crossover(_crossing(fit), sureness),
        "levels": [row["concurrency"] for row in rows],
        "tpot_ms": {pool: [row[pool]["tpot_ms"]["median"] for row in rows] for pool in POOLS},
        "from": {pool: [row[pool]["from"] for row in rows] for pool in POOLS},
        "requests": {pool: [row[pool]["requests"] for row in rows] for pool in POOLS},
        "samples": fit.samples,
    }


def _acceptance(live: float | None, profile: Profile | None) -> dict[str, Any]:
    """The speculative servers' live accept length, else the profile's: what the
    ``acceptance-crossover`` policy scales the speculative curve from."""
    definition = "tokens per decoding step, over every step (counter deltas, or SGLang's gauge)"
    if live is not None:
        return {
            "mean_accept_length": round(live, 3),
            "from": "live",
            "source": "the speculative servers' last polling windows, within the online window",
            "definition": definition,
        }
    accept = None if profile is None else profile.accept_length
    source = "no live accept length: the profile's" if accept is not None else "none known"
    return {
        "mean_accept_length": accept,
        "from": "profile" if accept is not None else None,
        "source": source,
        "definition": definition,
    }


def _measurement(
    online: Online, fits: tuple[LiveFit, ...], profile: Profile | None, now: float
) -> dict[str, Any]:
    """That it came from live traffic: the window, the samples, the mode, the rule, and
    the accept length the fit stands at with the samples it left out for another drafter's."""
    sureness = online.sureness
    fitted = online.fitted_at
    return {
        "source": "live traffic: the requests the router served",
        "online_mode": str(online.mode),
        "window_seconds": online.samples.max_age,
        "window_samples": online.per_level,
        "samples_kept": online.kept(),
        "samples_counted": sum(f.samples for f in fits),
        "min_samples": fits[0].min_samples,
        "drafter": {
            "accept_length": online.accept_length,
            "tolerance": online.accept_tolerance,
            "samples_left_out": online.left_out,
            "rule": "the speculative samples whose accept length (their server's at their "
            "end) is further than tolerance from accept_length (the speculative servers' at "
            "the fit), relative, were left out of it as taught by another drafter; those "
            "without one counted",
        },
        "shared_gpus": {
            "shared": online.shared,
            "beside_limit": BESIDE_LIMIT,
            "samples_left_out": online.beside,
            "rule": "on shared GPUs, the samples taken beside more than beside_limit of the "
            "other pool's requests (mean over their decode) were left out: the servers' steps "
            "take turns, so such a sample is not what a level of its pool alone means",
        },
        "prefill": {
            "at_prefill": online.at_prefill,
            "slope": [f.prefill_slope for f in fits],
            "rule": "slope: the seconds a prompt token sent to a sample's GPUs while it "
            "decoded adds to each of its tokens, fitted within each pool's level; with "
            "at_prefill, each sample's TPOT was read along it at its level's mean prefill, "
            "and a margin that turns more than once as the one fall most samples put it at",
        },
        "fitted_seconds_ago": None if fitted is None else round(now - fitted, 3),
        "bootstrap_replicates": REPLICATES,
        "sureness": {
            "min_samples": sureness.min_samples,
            "max_ratio": sureness.max_ratio,
            "rule": "sure (what --online adopt routes by): at least min_samples live samples "
            "at each level around the crossover in each pool (both measured live there), and a "
            "closed interval at most max_ratio wide (high / low); for a bound, as many at "
            "its level and 97.5% of the replicates finding it",
            "sure": [sureness.sure(f.crossing, holding=False) for f in fits],
        },
        "profile_in_force": None if profile is None else {"created": profile.created},
    }


def _count(level: float) -> float | int:
    """A level as calibration writes it: a whole number of requests as an integer."""
    return int(level) if level.is_integer() else level
