"""The prefill a sample decoded beside (the prompt tokens the router sent to its GPUs while it
decoded, counted on the workers' board), and ``online_at_prefill``: samples read at their
level's prefill, and a dense margin that turns more than once read as its one fall, the two
rules that keep bursty traffic (a plain request counted only when no request went to the
speculative server during its decode, so only when few prompts came) from making the plain
server look faster than it is."""

from __future__ import annotations

import math
import random

import pytest

from specroute.crossing import crossing, log_margin
from specroute.online.fit import fit, one_fall, prefill_slope
from specroute.online.samples import Sample
from specroute.router.workers.board import Board
from tests.router.online.test_online import LEVELS, dense

SLOPE = 40e-6  # seconds a token decoded waits per prompt token prefilled beside it (H200, 8B)
PREFILL = {"spec": (60.0, 140.0), "base": (0.0, 60.0)}  # prompt tokens per output token


def selected(per_level: int, known: bool, seed: int = 3) -> list[Sample]:
    """Each pool's samples at each level: the dense model's TPOT plus ``SLOPE`` times its
    prefill, the plain samples drawn from fewer prompts than the speculative ones (as a
    routing by arrivals selects them); ``known``: whether each carries its prefill."""
    rng, model, out, at = random.Random(seed), dense(1 / 16), [], 0.0
    for level in LEVELS:
        for pool in ("spec", "base"):
            for _ in range(per_level):
                at += 0.001
                x = rng.uniform(*PREFILL[pool])
                tpot = (model(pool, level) + SLOPE * x) * math.exp(rng.gauss(0, 0.03))
                sample = Sample(at, pool, level, tpot, 1000, prefill=x if known else None)
                out.append(sample)
    return out


def test_the_pools_are_compared_at_their_level_s_prefill() -> None:
    """The plain samples decoded through fewer prompts: as measured (the default) they put
    the crossover a level or more low; read at the level's prefill (both pools' mean), the
    fit finds the crossover of the two curves at that prefill, within its interval, and the
    slope, which it finds and shows either way."""
    model = dense(1 / 16)
    mean = (sum(PREFILL["spec"]) + sum(PREFILL["base"])) / 4  # equal counts of each pool
    truth = crossing(
        LEVELS,
        log_margin(
            [model("spec", c) + SLOPE * mean for c in LEVELS],
            [model("base", c) + SLOPE * mean for c in LEVELS],
        ),
    ).at
    assert truth is not None
    read = fit(selected(40, known=True), LEVELS, min_samples=16, at_prefill=True)
    measured = fit(selected(40, known=True), LEVELS, min_samples=16)  # the default
    unknown = fit(selected(40, known=False), LEVELS, min_samples=16, at_prefill=True)
    assert read.prefill_slope == pytest.approx(SLOPE, rel=0.15)
    assert measured.prefill_slope == read.prefill_slope  # found, and shown, either way
    assert unknown.prefill_slope == 0.0  # no prefill known: each as measured
    assert unknown.curves == measured.curves
    found, biased = read.crossing, measured.crossing
    assert found is not None and found.at is not None and biased is not None
    assert found.low is not None and found.high is not None
    assert found.low <= truth <= found.high, (found, truth)
    assert abs(math.log2(found.at / truth)) < 0.5
    biased_at = biased.at if biased.at is not None else biased.limit
    assert biased_at is not None and biased_at < truth / 2, (biased, truth)


def test_the_slope_is_within_each_pool_s_level_never_across_them() -> None:
    """A level's and a pool's TPOT differ by themselves; with prefill the same within each,
    there is no slope to fit (and never one below 0)."""
    rows = {
        pool: [
            [Sample(0.0, pool, c, 0.01 * c * (2 if pool == "base" else 1), 1, prefill=c * 10.0)] * 4
            for c in LEVELS
        ]
        for pool in ("spec", "base")
    }
    assert prefill_slope(rows) == 0.0  # type: ignore[arg-type]
    falling = {
        "spec": [[Sample(0.0, "spec", 4.0, 0.02 - 0.0001 * x, 1, prefill=x) for x in range(20)]]
    }
    assert prefill_slope(falling) == 0.0  # type: ignore[arg-type]


def test_a_dense_margin_that_turns_twice_is_read_as_the_fall_most_evidence_puts_it_at() -> None:
    """A level of few samples losing below levels of many that pay (a burst's plain
    requests, taken at another moment of the traffic): the crossover is the fall the most
    samples agree with, not a bound below the first level; a margin that falls once is the
    one crossing finder's, and one that only rises is speculation nowhere."""
    levels = [8.0, 16.0, 32.0, 64.0]
    noisy = [-0.03, 0.10, -0.08, -0.2]
    assert crossing(levels, noisy).bound == "below"
    found = one_fall(levels, noisy, [17, 64, 64, 64])
    assert found.at is not None and 16 < found.at < 32
    assert one_fall(levels, noisy, [200, 64, 10, 10]).bound == "below"  # the evidence says so
    once = [0.2, 0.1, -0.1, -0.3]
    assert one_fall(levels, once, [1, 1, 1, 1]) == crossing(levels, once)
    assert one_fall(levels, noisy, [0, 0, 0, 0]) == crossing(levels, noisy)  # none live
    rises = [-0.2, -0.1, 0.1, 0.3]
    assert one_fall(levels, rises, [1, 64, 64, 64]).bound == "below"


def test_the_board_counts_every_worker_s_prompts_and_keeps_a_dead_worker_s() -> None:
    """The prompts sent to a backend only grow, summed over the workers' slots: a worker
    that dies leaves its part, so that a sample spanning its death is not counted less."""
    board = Board(2, 2)
    board.add_inflight(0, 1, 1500, 1000)
    board.become(1)
    board.add_inflight(0, 1, 700, 500)
    board.add_inflight(1, 1, 300, 200)
    board.add_inflight(0, -1, -700)  # one ends: its prompt was sent all the same
    assert board.prompted(0) == 1500 and board.prompted(1) == 200
    board.forget(0)
    assert board.prompted(0) == 1500
