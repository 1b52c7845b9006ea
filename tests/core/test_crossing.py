"""The one crossing finder, as a table of cases, and the places that use it agreeing: the
profile's crossover is the one its curves give a policy, and the predictor's is the
finder's on its per-level speeds."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from specroute.crossing import Crossing, bands, crossing, crossings, log_margin
from specroute.emulator.predict import as_profile, predict
from specroute.loadgen.record import RequestRecord
from specroute.policies.acceptance_crossover import AcceptanceCrossoverPolicy
from specroute.policies.curves import curves
from specroute.policies.profile import parse_profile
from specroute.policies.registry import build_policy
from specroute.profiler.analysis import analyse, profile_document
from specroute.profiler.stats import (
    between_runs,
    crossing_with_ci,
    percentile_interval,
    resampled,
    run_draws,
    within_runs,
)
from specroute.profiler.sweep_data import Cell, SweepData
from tests.emulators import emulator_config

CASES: list[tuple[str, list[float], list[float], Crossing]] = [
    ("halfway in log concurrency", [1, 4], [1.0, -1.0], Crossing(2.0)),
    (
        "between the levels around it",
        [1, 2, 4, 8],
        [0.6, 0.2, -0.2, -0.5],
        Crossing(2 * math.sqrt(2)),
    ),
    ("zero at a level is the crossing", [1, 4, 16], [1.0, 0.0, -1.0], Crossing(4.0)),
    (
        "the first crossing, not a later one",
        [1, 2, 4, 8],
        [1.0, -1.0, 1.0, -1.0],
        Crossing(math.sqrt(2)),
    ),
    ("losing at the first level: below", [2, 4], [0.0, 1.0], Crossing(None, "below", 2)),
    ("winning everywhere: above", [1, 2], [1.0, 0.5], Crossing(None, "above", 2)),
    (
        "falling but not yet crossed: no guess past the levels",
        [1, 2],
        [1.0, 0.1],
        Crossing(None, "above", 2),
    ),
    ("one level", [4], [1.0], Crossing(None, "above", 4)),
]


@pytest.mark.parametrize(("name", "levels", "margin", "expected"), CASES, ids=[c[0] for c in CASES])
def test_crossing(name: str, levels: list[float], margin: list[float], expected: Crossing) -> None:
    found = crossing(levels, margin)
    if expected.at is None:
        assert found == expected
    else:
        assert found.at == pytest.approx(expected.at, rel=1e-12) and found.bound is None


def test_one_margin_per_level() -> None:
    with pytest.raises(ValueError, match="one margin per level"):
        crossing([1, 2], [1.0])


def test_times_and_rates_cross_at_the_same_concurrency() -> None:
    levels = [1, 2, 4, 8]
    spec, base = [5.0, 8.0, 14.0, 26.0], [10.0, 11.0, 13.0, 17.0]  # ms per token
    by_time = crossing(levels, log_margin(spec, base)).at
    # rates: higher is better, so they go the other way round
    by_rate = crossing(levels, log_margin([1 / b for b in base], [1 / s for s in spec])).at
    assert by_time is not None and 2 < by_time < 4
    assert by_rate == pytest.approx(by_time, rel=1e-12)


def test_replicates_without_a_crossing_open_the_interval_on_their_side() -> None:
    levels, point = [1, 2, 4], [1.0, 0.0, -1.0]
    above, below = [1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]
    found = crossing_with_ci(levels, point, [above] * 10 + [below] * 10 + [point] * 80)
    assert (found.value, found.low, found.high) == (2.0, None, None)  # not clipped to 1 and 4
    assert found.beyond == (0.1, 0.1) and found.open_side == "both"
    found = crossing_with_ci(levels, point, [above] * 10 + [point] * 90)
    assert (found.low, found.high, found.open_side) == (2.0, None, "above")  # "at least 2"
    few = crossing_with_ci(levels, point, [above] * 2 + [point] * 98)  # inside the tail
    assert (few.low, few.high, few.open_side) == (2.0, 2.0, None)
    nowhere = crossing_with_ci(levels, above, [point])
    assert (nowhere.value, nowhere.bound, nowhere.limit) == (None, "above", 4)


def test_the_interval_need_not_contain_the_point() -> None:
    levels, point = [1, 2, 4, 8], [1.0, 0.0, -1.0, -1.0]
    later = [1.0, 1.0, 0.5, -1.0]  # crosses between 4 and 8
    found = crossing_with_ci(levels, point, [later] * 100)
    assert (found.value, found.low, found.high) == (2.0, 4.0, 8.0)


def test_a_closed_end_reaches_to_the_level_measured_past_it() -> None:
    """Between two levels the crossing is interpolated on a straight line, a guess: the
    interval holds the whole bracket its replicates cross in."""
    levels, point = [1, 2, 4, 8], [1.0, 0.5, -0.5, -1.0]  # crosses at 3
    found = crossing_with_ci(levels, point, [point] * 100)
    assert found.value == pytest.approx(2 * 2**0.5) and (found.low, found.high) == (2.0, 4.0)


def test_every_sign_change_is_reported_and_the_first_fall_is_the_value() -> None:
    levels, margin = [1, 2, 4, 8, 16], [1.0, -1.0, -1.0, 1.0, -1.0]
    turns = crossings(levels, margin)
    assert [t.direction for t in turns] == ["down", "up", "down"]
    assert turns[0].at == pytest.approx(math.sqrt(2)) and turns[1].at == pytest.approx(4 * 2**0.5)
    assert crossing(levels, margin).at == turns[0].at
    found = crossing_with_ci(levels, margin, [margin])
    assert [(t.at, t.direction) for t in found.turns] == [(t.at, t.direction) for t in turns]
    assert found.value == turns[0].at and all(t.support == 1.0 for t in found.turns)
    assert found.bands == ((None, turns[0].at), (turns[1].at, turns[2].at))
    assert bands([1, 2, 4], [-1.0, 1.0, 1.0]) == [(2**0.5, 4.0)]  # paying at the top: to it
    assert bands([1, 2], [-1.0, -1.0]) == [] and bands([1, 2], [1.0, 1.0]) == [(None, 2.0)]
    assert crossings([1, 2], [-1.0, 1.0])[0].direction == "up"
    assert crossings([1], [1.0]) == []


def test_every_edge_has_its_interval_from_the_replicates_turns() -> None:
    """A band from about 5.7 to 22.6 whose replicates move each edge by a level or less:
    each edge's interval holds its replicates' turns, out to the levels measured past
    them; a replicate without the band counts against its support."""
    levels = [1, 2, 4, 8, 16, 32, 64]
    point = [-1.0, -1.0, -0.5, 0.5, 0.5, -0.5, -1.0]
    early = [-1.0, -0.5, 0.5, 0.5, 0.5, -0.5, -1.0]  # up between 2 and 4
    late = [-1.0, -1.0, -0.5, 0.5, 0.5, 0.5, -0.5]  # down between 32 and 64
    gone = [-1.0] * 7
    found = crossing_with_ci(levels, point, [point] * 80 + [early] * 10 + [late] * 8 + [gone] * 2)
    up, down = found.turns
    assert (up.direction, down.direction) == ("up", "down")
    assert (up.low, up.high) == (2.0, 8.0) and (down.low, down.high) == (16.0, 64.0)
    assert up.support == down.support == 0.98
    assert found.bands == ((up.at, down.at),)
    assert found.value is None and found.bound == "below"  # the first level did not pay


def test_runs_are_the_resampling_unit() -> None:
    """Two runs whose requests agree within each run but not between them: the interval
    spans both runs' medians (resampling requests alone would give 1.5 every time), and
    widens as the t interval of so few runs does; three runs at one value give none."""
    samples = np.array([1.0] * 20 + [2.0] * 20)
    draws = within_runs([20, 20], np.random.default_rng(0), 4000)
    assert set(np.unique(resampled(samples, draws, np.median))) == {1.5}
    shift = between_runs(np.array([1.0, 2.0]), run_draws(2, np.random.default_rng(1), 4000))
    low, high = percentile_interval(resampled(samples, draws, np.median) * shift)
    assert low < 1.0 and high > 2.0
    runs = np.array([1.0, 1.1, 1.2])  # three runs: a t interval with 2 degrees of freedom
    three = percentile_interval(
        np.exp(np.log(runs).mean())
        * between_runs(runs, run_draws(3, np.random.default_rng(2), 20000))
    )
    half = 4.303 * np.std(np.log(runs), ddof=1) / np.sqrt(3)  # t(0.975, 2 df) = 4.303
    assert np.log(three[1] / three[0]) / 2 == pytest.approx(half, rel=0.05)
    assert (between_runs(np.array([1.3]), np.ones(5)) == 1).all()
    uneven = within_runs([3, 5], np.random.default_rng(1), 500)
    means = resampled(np.array([0.0] * 3 + [1.0] * 5), uneven, np.mean)
    assert set(np.unique(means)) == {0.625}  # each run keeps its own requests


def _sweep(levels: list[int]) -> SweepData:
    """Closed-loop requests whose TPOT follows 5 ms x c^0.6 (spec) and 10 ms x c^0.35
    (base), each with 5% noise: they cross near 16."""
    rng = np.random.default_rng(7)
    cells = {}
    for level in levels:
        for backend, tpot in (("spec", 0.005 * level**0.6), ("base", 0.010 * level**0.35)):
            records = []
            for run in range(3):
                shift = rng.lognormal(0.0, 0.02)  # a run's own speed
                for _ in range(max(16, 2 * level)):
                    per_token = tpot * shift * rng.lognormal(0.0, 0.05)
                    records.append(
                        RequestRecord(
                            backend,
                            level,
                            run,
                            0.0,
                            0.1,
                            0.1 + 63 * per_token,
                            output_tokens=64,
                            measured=True,
                        )
                    )
            accepts = [2.873] if backend == "spec" else []
            cells[(backend, level)] = Cell(records, runs=3, accept_lengths=accepts)
    return SweepData(Path("synthetic"), {}, cells)


def test_the_profile_and_its_policies_give_one_crossover() -> None:
    document = profile_document(analyse(_sweep([1, 2, 4, 8, 12, 24, 32])))
    crossover = document["crossover"]
    assert {"value", "ci", "confidence", "metric", "crossings", "rule"} <= set(crossover)
    value = crossover["value"]
    assert 8 < value < 32 and crossover["ci"][0] <= value <= crossover["ci"][1]
    assert [t["direction"] for t in crossover["crossings"]] == ["down"]
    assert {row["spec"]["runs"] for row in document["levels"]} == {3}
    profile = parse_profile(document)
    assert curves(profile).crossover() == pytest.approx(value, rel=1e-9)
    assert build_policy("crossover", {}, profile).crossover() == value
    for name in ("acceptance-crossover", "expected-latency"):
        assert build_policy(name, {}, profile).crossover() == pytest.approx(value, rel=1e-9)
    aware = build_policy("acceptance-crossover", {}, profile)
    assert isinstance(aware, AcceptanceCrossoverPolicy)
    assert aware.threshold_at(3.5) > aware.threshold  # better acceptance pays longer
    assert aware.threshold_at(2.873) == aware.threshold == curves(profile).crossover()


def test_the_prediction_is_the_finder_on_its_speeds() -> None:
    config = emulator_config(
        "--hardware", "kimi-k2.5-8x-pcie-fitted", "--max-running-requests", "256"
    )
    prediction = predict(config, [1, 4, 8], 128, 64)
    levels = [lv.concurrency for lv in prediction.levels]

    def finder(pick: str) -> float | None:
        """Speeds are rates: the plain server's go first (``log_margin``)."""
        base = [getattr(lv.base, pick) for lv in prediction.levels]
        spec = [getattr(lv.spec, pick) for lv in prediction.levels]
        return crossing(levels, log_margin(base, spec)).at

    assert prediction.crossover is not None and prediction.throughput_crossover is not None
    assert prediction.crossover == pytest.approx(finder("per_request"), rel=1e-12)
    assert prediction.throughput_crossover == pytest.approx(finder("total"), rel=1e-12)
    profile = parse_profile(as_profile(prediction, config))
    assert profile.crossover.value == prediction.crossover
    assert curves(profile).crossover() == pytest.approx(prediction.crossover, rel=1e-9)
