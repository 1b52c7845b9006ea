from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from specroute.emulator.predict import as_profile, predict, speedup_crossing, verdict
from specroute.policies.curves import curves
from specroute.policies.profile import load_profile, parse_profile
from tests.emulators import emulator_config


def test_speedups_cross_where_their_log_reaches_zero() -> None:
    at = 2 * 2 ** (math.log(1.2) / math.log(1.2 / 0.8))  # linear in log concurrency
    assert speedup_crossing([(1, 1.5), (2, 1.2), (4, 0.8), (8, 0.5)]).at == pytest.approx(at)
    assert f"at concurrency {at:.1f}" in verdict([(1, 1.5), (2, 1.2), (4, 0.8)], "x")
    assert speedup_crossing([(1, 1.5), (2, 1.2)]).at is None
    assert "above 2" in verdict([(1, 1.5), (2, 1.2)], "x")
    assert "below 1" in verdict([(1, 0.9), (2, 0.8)], "x")
    assert "1 band(s): from 1.4 to 2 (the last level measured)" in verdict(
        [(1, 0.9), (2, 1.1)], "x"
    )
    band = verdict([(1, 0.9), (4, 1.1), (16, 1.2), (64, 0.9)], "x")
    assert band.endswith("in 1 band(s): from 2.1 to 38.5")


def test_kimi_crossover_sits_at_low_concurrency() -> None:
    config = emulator_config(
        "--hardware", "kimi-k2.5-8x-pcie-fitted", "--max-running-requests", "256"
    )
    prediction = predict(config, [1, 2, 4, 8, 16])
    assert prediction.levels[0].speedup > 1.15
    assert prediction.levels[-1].speedup < 0.95
    assert prediction.crossover is not None and 1 < prediction.crossover < 16
    accept = prediction.levels[0].spec.accept_length
    assert accept == pytest.approx(3.0, abs=0.1)


def test_weak_drafter_never_pays_on_kimi() -> None:
    config = emulator_config("--accept-length", "2.1", "--max-running-requests", "256")
    prediction = predict(config, [1, 4, 16])
    assert prediction.crossover is None
    assert all(level.speedup < 1 for level in prediction.levels)


def test_predict_command_prints_json_and_writes_a_profile(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "specroute",
            "emulate",
            "--hardware",
            "llama3.1-8b-h100",
            "--max-running-requests",
            "256",
            "--predict",
            "1,16,64,128",
            "--json",
            "--profile",
            str(tmp_path / "predicted.json"),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    result = json.loads(out.stdout)
    assert [lv["concurrency"] for lv in result["levels"]] == [1, 16, 64, 128]
    assert 16 < result["crossover"] < 128 and "throughput_crossover" in result
    assert result["levels"][0]["spec"]["per_request_tok_s"] == pytest.approx(373, rel=0.1)
    profile = load_profile(tmp_path / "predicted.json")  # what the router and policies read
    assert profile.crossover.value == result["crossover"]
    assert profile.raw["measurement"]["method"] == "predicted"
    found = curves(profile)
    assert found.crossover() == pytest.approx(result["crossover"], rel=1e-9)
    assert found.tpot["spec"].at(1) == pytest.approx(1 / 373, rel=0.1)
    assert found.max_running == {"spec": 256, "base": 256}


def test_a_prediction_without_a_crossover_gives_the_bound() -> None:
    config = emulator_config(
        "--hardware", "kimi-k2.5-8x-pcie-fitted", "--max-running-requests", "256"
    )
    above = parse_profile(as_profile(predict(config, [1, 2], 128, 64), config))
    assert (above.crossover.value, above.crossover.bound, above.crossover.limit) == (
        None,
        "above",
        2,
    )
    weak = emulator_config("--hardware", "kimi-k2.5-8x-pcie-fitted", "--accept-length", "2.1")
    below = parse_profile(as_profile(predict(weak, [1, 2], 128, 64), weak))
    assert below.crossover.bound == "below" and below.crossover.threshold == 0


def test_predict_command_prints_a_table_and_refuses_bad_flags() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "specroute", "emulate", "--predict", "1,2,4"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "speculation stops paying" in out.stdout or "pays" in out.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "specroute", "emulate", "--predict", "1", "--hardware", "nope"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "unknown hardware model 'nope'" in bad.stderr
