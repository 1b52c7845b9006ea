"""``specroute calibrate`` against two emulators of each shipped hardware model: the
crossover it measures over HTTP has an interval that contains the one the emulator
predicts in virtual time, at the levels the calibration chose."""

from __future__ import annotations

import asyncio
import json
import sys
from asyncio.subprocess import PIPE, STDOUT
from pathlib import Path

import pytest

from specroute.emulator.predict import predict
from specroute.policies.profile import load_profile
from tests.emulators import emulator_config
from tests.processes import emulator_pair
from tests.routers import running_router

# time scale, highest level, prompt tokens: fast, yet slow enough for one Python client to
# keep up. Kimi's 512-token prefill is modelled at 0.3 s, so its closed loop hinges on how
# arrivals straddle prefill steps, which a live client's latency moves by a few percent;
# with 128-token prompts the live loop stays within 1% of the virtual one.
CASES = {
    "kimi-k2.5-8x-pcie": ("0.25", "32", 128),
    "llama3.1-8b-h100": ("0.25", "256", 512),
    "llama3.1-8b-h200": ("0.25", "256", 512),
}
OUTPUT = 256


@pytest.mark.parametrize("hardware", CASES)
async def test_calibrated_interval_contains_the_predicted_crossover(
    hardware: str, tmp_path: Path
) -> None:
    scale, highest, prompt = CASES[hardware]
    flags = ("--hardware", hardware, "--time-scale", scale, "--stream-interval", "16",
             "--max-running-requests", "256")  # fmt: skip
    out = tmp_path / "profile.json"
    async with emulator_pair(*flags) as (spec, base):
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "specroute", "calibrate", "--spec", spec, "--base", base,
            "-o", str(out), "--report", str(tmp_path / "report.md"),
            "--plot", str(tmp_path / "crossover.png"), "--repeats", "2",
            "--max-concurrency", highest, "--budget", "3", "--input-len", str(prompt),
            "--output-len", str(OUTPUT), stdout=PIPE, stderr=STDOUT,
        )  # fmt: skip
        output = (await process.communicate())[0].decode()
        async with running_router(spec=[spec], base=[base], profile=out) as (_, state):
            routed_by = state.policy.describe()["crossover"]
    assert process.returncode == 0, output
    profile = json.loads(out.read_text())
    levels = [row["concurrency"] for row in profile["levels"]]
    expected = predict(emulator_config(*flags), levels, prompt, OUTPUT).crossover
    crossover = profile["crossover"]
    assert expected is not None and crossover["value"] is not None, output
    low, high = crossover["ci"]
    print(f"{hardware}: predicted {expected:.2f}, measured {crossover['value']:.2f} "
          f"[{low:.2f}, {high:.2f}] at levels {levels}")  # fmt: skip
    assert low <= expected <= high, f"predicted {expected:.1f}, measured {crossover}"

    calibration = profile["measurement"]["calibration"]
    assert calibration["backend_seconds"] < calibration["uniform_grid_backend_seconds"]
    assert profile["workload"]["mean_prompt_tokens"] == pytest.approx(prompt, rel=0.02)
    assert profile["acceptance"]["mean_accept_length"] > 2
    assert not profile["measurement"]["fairness_warnings"]
    assert "crossover" in output and "uniform grid" in output
    assert "below about" in (tmp_path / "report.md").read_text()
    assert (tmp_path / "crossover.png").read_bytes()[:4] == b"\x89PNG"
    assert load_profile(out).crossover.value == crossover["value"] == routed_by
