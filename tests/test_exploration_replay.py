"""Exploration in virtual time, through the router's own estimator and exploration fed as
the router feeds them (``bench/replay.py``): what it costs on the drift proof's trace, and
the cold start, a profile whose crossover is off by a factor of two corrected from live
traffic under ``--online adopt``. Each test prints what it measured (``pytest -s``)."""

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
    explored: int
    tps: float

    @property
    def converged_at(self) -> float | None:
        """The first fit from which every later one routes by a crossover in the bracket."""
        low, high = self.bracket
        at = None
        for t, adopted, _ in self.history:
            inside = adopted is not None and low <= adopted <= high
            at = (at if at is not None else t) if inside else None
        return at

    def requests_by(self, t: float) -> int:
        return sum(1 for r in self.records if r.start < t)


def cold_start(profiled_at: float, share: float) -> ColdStart:
    """The ramp replayed on the partitioned topology (each server on GPUs of its own, as the
    replay's engines are), the router adopting from a profile measured at ``profiled_at``."""
    truth_profile = predicted(TRUE_ACCEPT)
    truth = truth_profile.crossover.value
    assert truth is not None
    bracket = (max(x for x in LEVELS if x <= truth), min(x for x in LEVELS if x >= truth))
    trace = Trace("ramp", tuple(Phase(PHASE, c) for c in RAMP * REPEATS))
    plan = ReplayPlan(
        trace,
        synthetic(128, OUTPUT_LEN),
        {
            "spec": config_from_flags((*MODEL, "--accept-length", f"{TRUE_ACCEPT:g}"), "spec"),
            "base": config_from_flags(MODEL, "base"),
        },
        backends={"spec": ("http://spec:1",), "base": ("http://base:2",)},
        output_len=OUTPUT_LEN,
    )
    profile = predicted(profiled_at)
    online = Online(
        OnlineMode.ADOPT, Samples(24 * KEPT_PER_LEVEL, 600.0), Sureness(12), per_level=24
    )
    explores = Exploration(online, share, SPAN) if share else None
    learning = Learning(online, profile, shared=False, exploration=explores)
    policy = build_policy("crossover", {"topology": "partitioned"}, profile)
    records = replay(plan, policy, "cold start", learning)
    explored = 0 if explores is None else sum(explores.explored.values())
    tps = overall(trace, records)["output_tps"]
    return ColdStart(truth, bracket, records, learning.history, explored, tps)


def test_without_exploration_a_profile_whose_crossover_is_too_low_is_never_corrected() -> None:
    """Profiled at accept length 2.75 (crossover near 2.7), the server accepting 3.0 (near
    5.1): the speculative server is never seen above the stale crossover, so the live fit
    never settles on a crossover between the levels around the truth."""
    run = cold_start(LOW_ACCEPT, 0.0)
    assert run.bracket == (4, 6)
    adopted = [c for _, c, _ in run.history if c is not None]
    print(f"truth {run.truth:.2f}; adopted at {len(adopted)} of {len(run.history)} fits; ")
    print(f"{run.tps} tok/s over {len(run.records)} requests")
    assert run.converged_at is None
