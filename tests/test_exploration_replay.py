"""Exploration in virtual time, through the router's own estimator and exploration fed as
the router feeds them (``bench/replay.py``): what it costs on the drift proof's trace, and
the cold start, a profile whose crossover is off by a factor of two corrected from live
traffic under ``--online adopt``, in how long, with how many requests explored, at what cost
in tok/s. Each test prints what it measured (``pytest -s``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from specroute.bench.learning import Learning
from specroute.bench.replay import ReplayPlan, replay
from specroute.emulator.predict import as_profile, predict
from specroute.loadgen.dataset import synthetic
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.trace import Phase, Trace
from specroute.model_flags import config_from_flags
from specroute.policies.profile import Profile, parse_profile
from specroute.policies.registry import build_policy
from specroute.router.exploration import Exploration
from specroute.router.online import KEPT_PER_LEVEL, Online, OnlineMode, Sureness
from specroute.router.online_samples import Samples
from tests.test_online_drift import MODEL, drift_online, drift_plan, drift_profile, overall

SHARE = 0.02  # what --online-explore-share 0.02 explores: at most one request in 50
SPAN = 2.0  # --online-explore-span's default


def test_exploration_costs_under_2_percent_of_tok_s_on_the_drift_proof_s_trace() -> None:
    """The drift proof's replay under ``adopt``, with exploration at its default share and
    without: the tok/s given up to exploring."""
    plan, profile = drift_plan(), drift_profile()
    tps = {}
    for share in (SHARE, 0.0):
        online = drift_online()
        explores = Exploration(online, share, SPAN) if share else None
        learning = Learning(online, profile, exploration=explores)
        records = replay(plan, build_policy("crossover", {}, profile), "adopt", learning)
        tps[share] = overall(plan.trace, records)["output_tps"]
        explored = 0 if explores is None else sum(explores.explored.values())
        print(f"share {share}: {tps[share]} tok/s, {explored} of {len(records)} explored")
        assert explored <= share * len(records)
    ratio = tps[SHARE] / tps[0.0]
    print(f"tok/s with exploration over without: {ratio:.4f}")
    assert ratio > 0.98


# The cold start: the speculative server accepts TRUE_ACCEPT tokens a verify pass; the
# profile was measured at another accept length, its crossover a factor of two off.
LEVELS = [1, 2, 4, 6, 8, 12, 16, 24, 32]
OUTPUT_LEN = 64
TRUE_ACCEPT, LOW_ACCEPT = 3.0, 2.75
RAMP = (2, 4, 6, 8, 12, 8, 6, 4)  # clients, each for PHASE seconds, REPEATS times
PHASE, REPEATS = 20.0, 4


@cache
def predicted(accept_length: float) -> Profile:
    """What calibrating the speculative server at this accept length would write."""
    config = config_from_flags((*MODEL, "--accept-length", f"{accept_length:g}"), "spec")
    document = as_profile(predict(config, LEVELS, 128, OUTPUT_LEN), config)
    return parse_profile(json.loads(json.dumps(document)))


@dataclass(frozen=True)
class ColdStart:
    truth: float  # the crossover calibrating the server as it is would find
    bracket: tuple[float, float]  # the levels around it: its calibrated interval, at best
    records: list[RequestRecord]
    history: list[tuple[float, float | None, bool]]  # each fit: time, crossover adopted
    routed: list[tuple[float, float]]  # each fit: time, the crossover routed by (adopted,
    # or the profile's)
    explored: int
    tps: float

    @property
    def converged_at(self) -> float | None:
        """The first fit from which every later one routes by a crossover in the bracket."""
        low, high = self.bracket
        at = None
        for t, crossover in self.routed:
            at = (at if at is not None else t) if low <= crossover <= high else None
        return at

    def requests_by(self, t: float) -> int:
        return sum(1 for r in self.records if r.start < t)


def cold_start(
    profile: Profile, share: float, seed: int = 0, ramp: tuple[int, ...] = RAMP
) -> ColdStart:
    """The ramp replayed on the partitioned topology (each server on GPUs of its own, as the
    replay's engines are), the router adopting from ``profile``."""
    truth_profile = predicted(TRUE_ACCEPT)
    truth = truth_profile.crossover.value
    assert truth is not None
    bracket = (max(x for x in LEVELS if x <= truth), min(x for x in LEVELS if x >= truth))
    trace = Trace("ramp", tuple(Phase(PHASE, c) for c in ramp * REPEATS))
    plan = ReplayPlan(
        trace,
        synthetic(128, OUTPUT_LEN, seed=seed),
        {
            "spec": config_from_flags((*MODEL, "--accept-length", f"{TRUE_ACCEPT:g}"), "spec"),
            "base": config_from_flags(MODEL, "base"),
        },
        backends={"spec": ("http://spec:1",), "base": ("http://base:2",)},
        output_len=OUTPUT_LEN,
        seed=seed,
    )
    online = Online(
        OnlineMode.ADOPT, Samples(24 * KEPT_PER_LEVEL, 600.0), Sureness(12), per_level=24
    )
    explores = Exploration(online, share, SPAN) if share else None
    learning = Learning(online, profile, shared=False, exploration=explores)
    policy = build_policy("crossover", {"topology": "partitioned"}, profile)
    records = replay(plan, policy, "cold start", learning)
    explored = 0 if explores is None else sum(explores.explored.values())
    tps = overall(trace, records)["output_tps"]
    fallback = policy.crossover()
    assert fallback is not None
    routed = [(t, fallback if c is None else c) for t, c, _ in learning.history]
    return ColdStart(truth, bracket, records, learning.history, routed, explored, tps)


def test_from_a_profile_a_factor_of_two_off_exploring_2_percent_converges_within_the_interval() -> (
    None
):
    """Profiled at accept length 2.75 (crossover near 2.7), the server accepting 3.0 (near
    5.1): exploring at a share of 0.02, the crossover routed by comes between the levels
    around the truth (4 and 6: the calibrated interval, at best) within the ramp's first
    cycle and stays there to the end; without exploration it gets there later. What it
    costs: tok/s against the same replay without exploration, and exploring against not
    with the true profile (where the crossover routed by is the same)."""
    runs = {
        (label, share): cold_start(predicted(accept), share)
        for label, accept in (("off", LOW_ACCEPT), ("true", TRUE_ACCEPT))
        for share in (SHARE, 0.0)
    }
    run, alone = runs["off", SHARE], runs["off", 0.0]
    assert run.bracket == (4, 6)
    at, later = run.converged_at, alone.converged_at
    assert at is not None and later is not None
    inside = [c for t, c in run.routed if t >= at]
    print(
        f"truth {run.truth:.2f}, bracket {run.bracket}: routed by {min(inside):.2f} to "
        f"{max(inside):.2f} from {at:g} s ({run.requests_by(at)} of {len(run.records)} "
        f"requests) to the end; explored {run.explored}; without exploration from "
        f"{later:g} s ({alone.requests_by(later)} requests)"
    )
    for (label, share), r in runs.items():
        print(f"profile {label}, share {share}: {r.tps} tok/s, {len(r.records)} requests")
    cost = run.tps / alone.tps
    at_truth = runs["true", SHARE].tps / runs["true", 0.0].tps
    print(
        f"tok/s exploring over not: {cost:.4f}; at the true profile {at_truth:.4f}; "
        f"against the true profile unexplored: {run.tps / runs['true', 0.0].tps:.4f}"
    )
    assert at <= PHASE * len(RAMP)  # within the ramp's first cycle
    assert at < later
    assert run.explored <= SHARE * len(run.records)
    assert cost > 0.98 and at_truth > 0.98
