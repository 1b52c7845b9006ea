"""Bands where speculation pays, found by calibration (``specroute emulate --calibrate``: the
search on noisy mixture-of-experts engines in virtual time), written to the profile with an
interval per edge, reported, drawn, and routed by.

The truth is the noise-free engine's prediction (``emulator.predict``) at the levels the
calibration measured. With 512-token prompts and 32-token answers (short, so prefill
weighs on every answer's time per token), on the measured Qwen3-30B-A3B model at accept
length 1.6 speculation pays only between about 17 and 88 requests; on the Kimi-K2.5 case study's
model built from physics, at the case study's accept length 2.1, between about 27 and 61 (with
128-token answers: from 54 to about 290).
"""

from __future__ import annotations

import importlib.util
import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specroute.crossing import bands
from specroute.emulator.noise import Noise
from specroute.emulator.predict import predict
from specroute.policies.profile import parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import BackendView, RequestInfo, View
from tests.emulators import emulator_config
from tests.profiler.test_bench import run

OUTPUT = 32


async def calibrated(tmp_path: Path, *flags: str) -> tuple[dict[str, Any], list[float]]:
    """``specroute emulate --calibrate``'s profile (its report and plot written too), and
    the noise-free engine's band edges at the levels it measured (what its interpolation
    aims at)."""
    model = (*flags, "--noise", "default", "--seed", "3")
    code, stdout, stderr = await run(
        "emulate",
        *model,
        "--input-len",
        "512",
        "--output-len",
        str(OUTPUT),
        "--calibrate",
        "--profile",
        str(tmp_path / "p.json"),
        "--report",
        str(tmp_path / "r.md"),
        "--plot",
        str(tmp_path / "bands.png"),
    )
    assert code == 0, stderr
    assert "speculation pays in 1 band(s) of load" in stdout
    profile = json.loads((tmp_path / "p.json").read_text())
    assert "1 band(s) of load, from " in (tmp_path / "r.md").read_text()
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "bands.png").read_bytes()[:4] == b"\x89PNG"
    levels = [row["concurrency"] for row in profile["levels"]]
    truth = predict(replace(emulator_config(*model), noise=Noise()), levels, 512, OUTPUT)
    speedups = [math.log(lv.speedup) for lv in truth.levels]
    return profile, [e for band in bands(levels, speedups) for e in band if e is not None]


def route(
    profile: dict[str, Any],
    load: int,
    policy: str = "crossover",
    accept_length: float | None = None,
) -> str:
    """Where a policy sends a request that would make the load ``load``; the speculative
    server's live accept length, if it reports one."""
    chosen = build_policy(policy, {}, parse_profile(profile))
    spec = BackendView(
        "s",
        "spec",
        True,
        load - 1,
        accept_length=accept_length,
        accept_length_age=0.0 if accept_length else None,
    )
    view = View((spec, BackendView("b", "base", True, 0)))
    return chosen.choose(RequestInfo(path="/v1/completions"), view).pool


def check_against_truth(profile: dict[str, Any], edges: list[float]) -> None:
    """The profile's crossings are the truth's, each inside its interval; the crossover
    policy sends a request to the plain server below the band and above it, and to the
    speculative one inside it."""
    crossover = profile["crossover"]
    assert isinstance(crossover, dict)
    turns = crossover["crossings"]
    assert [t["direction"] for t in turns] == ["up", "down"][: len(edges)]
    for turn, truth in zip(turns, edges, strict=True):
        assert turn["ci"][0] <= truth <= turn["ci"][1] and turn["support"] > 0.8, (turn, truth)
    ((start, end),) = crossover["bands"]
    assert start == pytest.approx(turns[0]["at"], abs=1e-3)
    assert crossover["value"] is None and crossover["bound"] == "below"  # lost at 1
    inside = round(math.sqrt(start * end))
    for policy in ("crossover", "acceptance-crossover"):  # the latter at the measured length
        assert [route(profile, n, policy) for n in (1, inside)] == ["base", "spec"], policy
        if len(turns) > 1:
            assert route(profile, math.ceil(end * 1.2), policy) == "base", policy
    # a better drafter than measured pays from a lower load, a worse one from a higher
    measured = profile["acceptance"]["mean_accept_length"]
    below = math.floor(start * 0.9)
    assert route(profile, below, "acceptance-crossover", measured * 1.3) == "spec"
    assert route(profile, math.ceil(start * 1.1), "acceptance-crossover", measured / 1.3) == "base"


async def test_a_measured_moe_pays_in_a_band(tmp_path: Path) -> None:
    """Qwen3-30B-A3B on one H200, every step time measured, a weak drafter: loses at low
    load (verifying touches many more experts), pays at medium, fades as compute binds."""
    profile, edges = await calibrated(
        tmp_path,
        "--hardware",
        "qwen3-30b-a3b-h200",
        "--accept-length",
        "1.6",
        "--max-running-requests",
        "128",
    )
    assert len(edges) == 2 and 8 < edges[0] < 32 and 48 < edges[1] < 128
    check_against_truth(profile, edges)


async def test_the_case_study_model_pays_in_a_band_of_medium_load(tmp_path: Path) -> None:
    profile, edges = await calibrated(
        tmp_path,
        "--hardware",
        "kimi-k2.5-8x-pcie",
        "--accept-length",
        "2.1",
        "--max-running-requests",
        "512",
    )
    assert len(edges) == 2 and 16 < edges[0] < 48 and 48 < edges[1] < 128
    check_against_truth(profile, edges)


async def test_a_calibration_that_meets_no_crossing_gives_no_grid_to_compare(
    tmp_path: Path,
) -> None:
    """Speculation pays at every level up to the ceiling: no crossing was measured, so a
    uniform grid "as fine near the crossover" means nothing and none is estimated."""
    out = tmp_path / "p.json"
    code, stdout, stderr = await run(
        "emulate",
        "--hardware",
        "llama3.1-8b-h100",
        "--calibrate",
        "--max-running-requests",
        "4",
        "--input-len",
        "128",
        "--output-len",
        "32",
        "--profile",
        str(out),
    )
    assert code == 0, stderr
    calibration = json.loads(out.read_text())["measurement"]["calibration"]
    assert calibration["uniform_grid_levels"] is None
    assert calibration["uniform_grid_backend_seconds"] is None
    assert "no crossing was measured, so there is no uniform grid to compare with" in stdout
    assert "a uniform grid as fine" not in stdout
