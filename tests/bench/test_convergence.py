"""The proof of online calibration from a wrong start, offline in virtual time
(``bench.convergence``): a dense model's pair on one GPU group, routed by the crossover
with ``--online adopt`` and every other online setting at the router's defaults, from no
profile and from a crossover 4x above and 4x below the truth, on a ramp from a quarter of
the truth to four times it: each ends routing by a crossover between the levels around the
truth, every stretch outside it after a first adoption back within a stated time, exploring
no more than its share; and a mixture-of-experts pair from no profile learns where its band
starts. What
exploring costs in tok/s, and the Azure trace's runs, are in the committed bench JSON
(``specroute bench convergence``), which the docs render."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from specroute.bench.convergence import Converged, converge, defaults
from specroute.cli import main

DENSE = (
    "--hardware",
    "llama3.1-8b-h200",
    "--accept-length",
    "1.6",
    "--max-running-requests",
    "256",
)
RAMPS = 4  # cycles of 8 minutes


@cache
def run(start: str) -> Converged:
    return converge(DENSE, start, RAMPS, priced=False)


@pytest.mark.parametrize("start", ["none", "4x high", "4x low"])
def test_from_a_wrong_start_adopt_comes_to_the_truth_and_stays(start: str) -> None:
    found = run(start)
    low, high = found.truth.interval
    print(
        f"from {start} ({found.started_at:.1f}): truth {found.truth.crossover:.1f} "
        f"[{low:g}, {high:g}], in it from {found.converged_at} s ({found.requests_by} of "
        f"{found.requests} requests), {found.explored} explored in {found.turns} turns, "
        f"out of it after adopting: {found.outside}"
    )
    assert (low, high) == (16, 32)
    assert found.converged_at is not None and low <= found.routed_at_end <= high
    assert found.held  # every stretch out after adopting back within the stated time
    assert found.explored <= defaults().online.explore_share * found.requests
    assert found.turns >= 1


MOE = (
    "--hardware",
    "qwen3-30b-a3b-h200",
    "--accept-length",
    "1.6",
    "--max-running-requests",
    "256",
)


def test_from_no_profile_a_mixture_of_experts_band_starts_where_it_truly_starts() -> None:
    """A mixture-of-experts pair (speculation loses 5 to 12% at one to three requests, pays
    from about 13 up) from no profile: the router learns a band, not the dense model's one
    crossover, its start between the levels around the truth's: it does not speculate at
    the low loads where speculation loses (at the band's top it stops where the evidence
    does: a gain missed, not a loss taken)."""
    found = converge(MOE, "none", RAMPS, priced=False)
    (edge,) = [e for e in found.truth.edges if e.direction == "up"]
    ((start, top),) = found.bands_at_end
    assert start is not None and edge.interval[0] <= start <= edge.interval[1]
    assert top is not None and top > start


def test_the_command_says_how_each_start_went_and_keeps_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "convergence.json"
    model = ("--hardware", "kimi-k2.5-8x-pcie-fitted", "--max-running-requests", "256")
    given = ("--starts", "4x high", "--traffic", "ramp", "--ramps", "1", "--out", str(out))
    code = main(["bench", "convergence", *model, *given, "--draws", "2"])
    said = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert code == 0 and "4x high" in said and "in for good at" in said
    (row,) = document["runs"]
    first, second = document["draws"]
    assert (first["seed"], second["seed"]) == (0, 1)
    assert (first["converged_at"], first["routed_at_end"]) == (
        row["converged_at"],
        row["routed_at_end"],
    )
    for draw in (first, second):
        within = draw["longest_out"] <= document["reverted_within"]
        assert draw["held"] == (draw["converged_at"] is not None and within)
    held = first["held"] + second["held"]
    assert f"from 4x high, ramp: held {held} of 2" in said
    assert row["start"] == "4x high" and row["traffic"] == "ramp"
    assert row["started_at"] == pytest.approx(4 * row["truth"]["crossover"])
    assert row["cost"] is not None and row["tps_unexplored"] > 0
    assert document["defaults"]["online_explore_share"] == defaults().online.explore_share
    assert main(["bench", "convergence", *model, "--starts", "9x"]) != 0
    assert "not a start or a traffic: 9x" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["bench", "convergence", *model, "--draws", "0"])
    assert "--draws: must be positive" in capsys.readouterr().err


def test_on_the_ramp_the_truth_costs_nothing_and_a_crossover_too_high_costs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--fixed``: each crossover routed by throughout, no online calibration. On one cycle
    of the ramp, routing by the truth serves within 2% of never speculating (this pair's
    drafter accepts 1.6 tokens a step: there is little to gain), where a crossover 4x high
    costs several percent of tok/s and always speculating over a tenth."""
    out = tmp_path / "fixed.json"
    given = ("--starts", "", "--traffic", "ramp", "--ramps", "1", "--fixed", "0,20,80,1e9")
    assert main(["bench", "convergence", *DENSE, *given, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert document["runs"] == [] and "in for good at" not in said
    never, truth_, high, always = document["fixed"]
    assert [r["crossover"] for r in (never, truth_, high, always)] == [0, 20, 80, 1e9]
    assert truth_["tps"] == pytest.approx(never["tps"], rel=0.02)
    assert high["tps"] < 0.97 * truth_["tps"] and always["tps"] < 0.9 * truth_["tps"]
    assert high["latency"] > truth_["latency"] < always["latency"]
    assert "fixed crossovers" in said and "ramp: 0: " in said
    assert main(["bench", "convergence", *DENSE, "--fixed", "-1"]) != 0
    assert main(["bench", "convergence", *DENSE, "--starts", ""]) != 0
