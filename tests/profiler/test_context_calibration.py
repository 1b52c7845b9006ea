"""The crossover by context: ``emulate --predict`` and ``emulate --calibrate`` over several
``--input-len``, the ``specroute.profile/v2`` they write, its report and plot.

The two context-aware Llama-3.1-8B H200 models at accept length 2.0, 256 running requests
at most. With attention read once per query token (``-sdpa``) a verify of 4 reads the cache
4 times, so speculation's cost grows with context and the crossover falls: 47 at 576 tokens
of context, 21 at 2,112 and 1.7 at 8,256 (512, 2,048 and 8,192 prompt tokens, 128-token
answers). Read once per step (``-folded``) the verify's extra tokens cost ever less beside
the shared read, and the crossover rises: 97, 126 and above 256 (256-token answers; with
shorter ones the long prompts' prefill, the same in both modes, flattens the margin).
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from specroute.emulator.config import EmulatorConfig
from specroute.measure import rehearsal_buckets
from specroute.policies.profile import SCHEMA, SCHEMA_V2, parse_profile
from specroute.policies.registry import build_policy
from tests.emulators import emulator_config
from tests.profiler.test_bench import run

INPUTS = "512,2048,8192"
CONTEXTS = [512 + 64, 2048 + 64, 8192 + 64]  # input + output / 2
SDPA = (
    "--hardware",
    "llama3.1-8b-h200-sdpa",
    "--accept-length",
    "2.0",
    "--max-running-requests",
    "256",
    "--output-len",
    "128",
)
FOLDED = (
    "--hardware",
    "llama3.1-8b-h200-folded",
    "--accept-length",
    "2.0",
    "--max-running-requests",
    "256",
    "--output-len",
    "256",
)
EMULATE = (sys.executable, "-m", "specroute", "emulate")


@pytest.fixture(scope="module")
def predicted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Both models' predictions, side by side: the SDPA one as JSON, the folded one as
    text, each also written as a profile."""
    folder = tmp_path_factory.mktemp("predicted")
    commands = {
        "sdpa": [*SDPA, "--predict", "1,2,4,8,16,32,64", "--json"],
        "folded": [*FOLDED, "--predict", "64,128,256"],
    }
    processes = {
        name: subprocess.Popen(
            [*EMULATE, *flags, "--input-len", INPUTS, "--profile", str(folder / f"{name}.json")],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, flags in commands.items()
    }
    found: dict[str, Any] = {}
    for name, process in processes.items():
        out, err = process.communicate()
        assert process.returncode == 0, err
        found[name] = out
        found[f"{name}.profile"] = json.loads((folder / f"{name}.json").read_text())
    return found


def thresholds(profile: dict[str, Any]) -> list[float]:
    """Each context bucket's crossover, or the edge it is bounded by."""
    axis = parse_profile(profile).context
    assert axis is not None
    return [b.crossover.threshold for b in axis.buckets]


def test_the_crossover_falls_with_context_when_each_query_token_reads_the_cache(
    predicted: dict[str, Any],
) -> None:
    each = json.loads(predicted["sdpa"])
    assert [p["context"] for p in each] == CONTEXTS
    assert [p["input_len"] for p in each] == [512, 2048, 8192]
    crossovers = [p["crossover"] for p in each]
    assert crossovers[0] > crossovers[1] > crossovers[2] and crossovers[0] > 4 * crossovers[2]
    profile = predicted["sdpa.profile"]
    assert profile["schema"] == SCHEMA_V2
    assert thresholds(profile) == pytest.approx(crossovers)
    assert profile["crossover"] == profile["context"]["buckets"][0]["crossover"]
    assert 0.1 < profile["context"]["tokens_per_byte"] < 0.4  # about 5 bytes a word


def test_the_crossover_rises_with_context_when_a_step_reads_the_cache_once(
    predicted: dict[str, Any],
) -> None:
    text = predicted["folded"]
    for n in (512, 2048, 8192):
        assert f"predicted steady state, {n} input tokens" in text
    assert "crossover by context" in text
    table = text.split("crossover by context")[1].splitlines()[2:]
    assert [row.split()[:2] for row in table] == [[f"{n + 128}", f"{n}"] for n in (512, 2048, 8192)]
    assert table[-1].split()[2:4] == ["above", "256"]
    first, second, last = thresholds(predicted["folded.profile"])
    assert first < second < last and last >= 2 * first


async def test_calibration_per_context_within_one_budget(
    tmp_path: Path, predicted: dict[str, Any]
) -> None:
    """Noisy engines in virtual time, one context bucket after another: each bucket's
    interval holds the noise-free prediction and the crossover falls as predicted; the
    next bucket starts from a quarter of the last one's crossing; with one --input-len the
    profile is v1 as before; a budget is shared by all buckets."""
    files = {k: tmp_path / k for k in ("p.json", "r.md", "c.png", "one.json", "cut.json")}
    calibrate = ("emulate", *SDPA, "--noise", "default", "--calibrate")
    runs = await asyncio.gather(
        run(
            *calibrate,
            "--input-len",
            INPUTS,
            "--profile",
            str(files["p.json"]),
            "--report",
            str(files["r.md"]),
            "--plot",
            str(files["c.png"]),
            "--out",
            str(tmp_path / "sweep"),
        ),
        run(*calibrate, "--input-len", "512", "--profile", str(files["one.json"])),
        run(
            *calibrate, "--input-len", INPUTS, "--profile", str(files["cut.json"]), "--budget", "8"
        ),
    )
    for code, _, stderr in runs:
        assert code == 0, stderr
    assert "by context:" in runs[0][1] and "by context:" not in runs[1][1]

    profile = json.loads(files["p.json"].read_text())
    axis = parse_profile(profile).context
    assert profile["schema"] == SCHEMA_V2 and axis is not None
    buckets = profile["context"]["buckets"]
    assert [b["context"] for b in buckets] == CONTEXTS
    assert [Path(b["sweep"]).name for b in buckets] == [f"input-len-{n}" for n in (512, 2048, 8192)]
    truths = [p["crossover"] for p in json.loads(predicted["sdpa"])]
    for bucket, truth in zip(buckets, truths, strict=True):
        low, high = bucket["crossover"]["ci"]
        assert (low or 0) <= truth <= (high or math.inf), (bucket["crossover"], truth)
    values = [b["crossover"]["value"] for b in buckets]
    assert values[0] > values[1] > values[2]
    predicted_ratio = predicted["sdpa.profile"]["context"]["tokens_per_byte"]
    assert axis.tokens_per_byte == pytest.approx(predicted_ratio, rel=0.02)
    crossing = buckets[0]["crossover"]["crossings"][0]["at"]
    start = 2 ** math.floor(math.log2(crossing / 4))
    assert buckets[1]["calibration"]["levels_measured"][:2] == [1, start]
    for bucket in buckets:  # each bucket's curves: its medians, rising with context
        assert len(bucket["tpot_ms"]["spec"]) == len(bucket["levels"])
    assert buckets[0]["tpot_ms"]["base"][0] < buckets[2]["tpot_ms"]["base"][0]
    first = {
        pool: [lv[pool]["tpot_ms"]["median"] for lv in profile["levels"]]
        for pool in ("spec", "base")
    }
    assert buckets[0]["tpot_ms"] == first
    policy = build_policy("expected-latency", {}, parse_profile(profile))
    assert policy.describe()["curve_contexts"] == [b["context"] for b in buckets]
    seconds = sum(b["calibration"]["backend_seconds"] for b in buckets)
    assert profile["measurement"]["backend_seconds"] == pytest.approx(seconds, abs=1)

    # the kept sweep, analysed again: the same v2 profile, but for the search's own record
    code, _, stderr = await run("profile", str(tmp_path / "sweep"), "-o", str(tmp_path / "again"))
    assert code == 0, stderr
    again = json.loads((tmp_path / "again").read_text())
    assert again["schema"] == SCHEMA_V2 and again["context"]["buckets"] == [
        {k: v for k, v in b.items() if k != "calibration"} for b in buckets
    ]
    code, _, stderr = await run(
        "profile", str(tmp_path / "sweep" / "input-len-2048"), "-o", str(tmp_path / "one-bucket")
    )
    assert code == 0, stderr
    assert json.loads((tmp_path / "one-bucket").read_text())["crossover"] == buckets[1]["crossover"]

    report = files["r.md"].read_text()
    assert "## Crossover by context" in report
    assert report.count("\n| 576 |") + report.count("\n| 2112 |") + report.count("\n| 8256 |") == 3
    if importlib.util.find_spec("matplotlib"):
        assert files["c.png"].read_bytes()[:4] == b"\x89PNG"

    one = json.loads(files["one.json"].read_text())
    assert one["schema"] == SCHEMA and "context" not in one
    assert set(one) == {
        "schema",
        "created",
        "crossover",
        "throughput_crossover",
        "levels",
        "acceptance",
        "servers",
        "workload",
        "measurement",
    }
    assert one["crossover"]["value"] == profile["crossover"]["value"]  # the same first bucket

    assert profile["measurement"]["sweep"] == str(tmp_path / "sweep")  # kept; else named nowhere
    assert one["measurement"]["sweep"] is None
    cut = json.loads(files["cut.json"].read_text())["context"]["buckets"]
    assert all(b["sweep"] is None for b in cut)
    spent = [b["calibration"]["backend_seconds"] for b in cut]
    assert sum(spent) <= 8 * 60 * 1.25 and all(b["levels"] for b in cut)
    assert spent[-1] > 8 * 60 / 3  # what the others left over went to the last


def test_each_context_bucket_draws_noise_of_its_own(tmp_path: Path) -> None:
    """A rehearsal's buckets are seeded apart (--seed, --seed + 1, ...): a run at the same
    level and repeat in two buckets is off its noise-free time by factors of its own, so
    the buckets' intervals are independent measurements; with one seed they were equal."""
    flags = ("--mode", "spec", "--hardware", "llama3.1-8b-h200-sdpa")
    noisy, clean = emulator_config(*flags, "--noise", "default"), emulator_config(*flags)

    def seconds(config: EmulatorConfig) -> list[float]:
        buckets = rehearsal_buckets(config, [512, 520], 64, 0, tmp_path)
        runs = [asyncio.run(b.sweep.run_one("spec", 4, 0))[0] for b in buckets if b.sweep]
        return [run.t1 - run.t0 for run in runs]

    factors = [n / c for n, c in zip(seconds(noisy), seconds(clean), strict=True)]
    assert len(factors) == 2 and abs(factors[0] - factors[1]) > 0.01, factors
