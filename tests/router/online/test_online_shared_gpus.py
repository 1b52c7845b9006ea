"""Samples that mean what a level means on shared GPUs, offline in virtual time: the Kimi-K2.5
case study's fitted pair on one GPU group, their steps taking turns, routed by the crossover
over a ramp of closed-loop clients. A plain request that decoded beside speculative ones
waited for their steps too; the fit leaves such samples out, and the plain curve it learns
from the rest is the plain server's alone, as calibration measures it, within the fit's own
interval at every level it saw. Counted in, the same samples put the plain curve off it."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from functools import cache

from specroute.bench.learning import Learning
from specroute.bench.replay import ReplayPlan, replay
from specroute.emulator.config import EmulatorConfig
from specroute.emulator.predict import as_profile, predict
from specroute.loadgen.dataset import synthetic
from specroute.loadgen.trace import Phase, Trace
from specroute.model_flags import config_from_flags
from specroute.online.estimator import KEPT_PER_LEVEL, Online, OnlineMode, Sureness
from specroute.online.fit import Level
from specroute.online.samples import Samples, beside_other
from specroute.policies.curves import curves
from specroute.policies.profile import Profile, parse_profile
from specroute.policies.registry import build_policy

MODEL = ("--hardware", "kimi-k2.5-8x-pcie-fitted", "--max-running-requests", "256")
LEVELS = [1, 2, 4, 6, 8, 12, 16, 24]
OUTPUT_LEN = 256  # answers of about 8 s at 8 requests: a phase's first ones spill over
RAMP = (2, 4, 8, 12, 16, 24, 16, 12, 8, 4) * 2  # clients, each for PHASE seconds
PHASE = 10.0
NOISE = ("--noise", "step=0.05")  # each step jittered, so that an interval is one
SEEN = 12  # the samples a level of the plain curve needs to be compared here
# how far apart the plain server alone gives a level's median under two arrival patterns
# (the ramp's, and calibration's closed loop started at once): up to 3% here, beyond the
# interval of one run's samples, which knows nothing of how their requests were spread
PATTERN = 0.03


def pair(*flags: str) -> tuple[EmulatorConfig, EmulatorConfig]:
    """The pair on one GPU group (a name the virtual clock keys the turns by)."""
    spec = config_from_flags((*MODEL, "--share-gpus", "group", *flags), "spec")
    return spec, replace(spec, mode="base")


@cache
def truth() -> Profile:
    """What calibrating the pair writes: each server alone at each level."""
    spec, base = pair()
    document = as_profile(predict(spec, LEVELS, 128, OUTPUT_LEN, base=base), spec)
    return parse_profile(json.loads(json.dumps(document)))


@cache
def learned(policy_name: str) -> Online:
    """The router's estimator after the ramp routed by ``policy_name``, its samples kept
    (observe)."""
    spec, base = pair(*NOISE)
    plan = ReplayPlan(
        Trace("ramp", tuple(Phase(PHASE, c) for c in RAMP)),
        synthetic(128, OUTPUT_LEN),
        {"spec": spec, "base": base},
        backends={"spec": ("http://spec:1",), "base": ("http://base:2",)},
        output_len=OUTPUT_LEN,
    )
    online = Online(OnlineMode.OBSERVE, Samples(64 * KEPT_PER_LEVEL, 3600.0), Sureness(SEEN))
    profile = truth()
    policy = build_policy(policy_name, {}, profile)  # the crossover's topology: shared
    replay(plan, policy, policy_name, Learning(online, profile))
    return online


def plain_levels(online: Online, shared: bool) -> dict[float, Level]:
    """The plain curve's levels with enough samples, all counted (shared False) or those
    alone on the GPUs only."""
    online.refit(PHASE * len(RAMP), truth(), shared)
    return {lv.level: lv for lv in online.fits[0].curves["base"] if lv.samples >= SEEN}


def meet(a: Level, b: Level) -> bool:
    """The two levels' intervals meet, each widened by ``PATTERN``."""
    assert a.low is not None and a.high is not None and b.low is not None and b.high is not None
    widen = 1 + PATTERN
    return a.low / widen <= b.high * widen and b.low / widen <= a.high * widen


def test_the_plain_curve_learned_beside_speculative_traffic_is_the_plain_curve_alone() -> None:
    """The plain server alone over the ramp (every request to it), and beside the
    speculative one (the crossover routing, which spills plain requests among speculative
    ones as the load rises past it): at every level both saw, the two curves' intervals
    meet (widened by what the arrival pattern moves a level); counting the samples taken
    beside, at some level they do not: the plain server looks slower than it is, and the
    crossover higher."""
    alone = plain_levels(learned("always-base"), shared=True)
    online = learned("crossover")
    window = online.samples.window(PHASE * len(RAMP))
    beside = [s for s in window if beside_other(s)]
    assert any(s.pool == "base" for s in beside)  # the spill: plain among speculative
    seen = plain_levels(online, shared=True)
    assert online.beside == len(beside)
    print(f"{len(window)} samples, {len(beside)} beside the other pool's, left out")
    both = sorted(set(seen) & set(alone))
    assert len(both) >= 3, (seen, alone)
    for at in both:
        print(f"plain at {at:g}: beside spec {seen[at]}; alone {alone[at]}")
        assert meet(seen[at], alone[at])
    # the plain samples taken beside: slower than the plain server alone at their load
    plain = curves(truth()).tpot["base"]
    slower = sorted(s.tpot / plain.at(s.load) for s in beside if s.pool == "base")
    print(f"plain beside speculative, over alone at their load: {slower}")
    assert statistics.median(slower) > 1 + 2 * PATTERN
