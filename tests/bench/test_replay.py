"""The offline comparison: a trace replayed in virtual time through the emulator's engine
model and the policies, with the oracle's gap."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import pytest

from specroute.bench.replay import ReplayPlan, replay
from specroute.emulator.config import EmulatorConfig
from specroute.emulator.predict import predict
from specroute.loadgen.dataset import synthetic
from specroute.loadgen.trace import Phase, Trace
from specroute.policies.static import AlwaysPolicy
from specroute.policies.view import Pool
from tests.emulators import emulator_config
from tests.profiler.test_bench import run


def test_a_steady_replay_agrees_with_the_models_prediction() -> None:
    """One client for a while is what ``--predict`` measures at concurrency 1: both run the
    same engine, so their TPOT must agree. (With more clients they differ by design: the
    replay starts a phase's clients together, as a live trace does, while the prediction
    staggers them as the calibration sweep does; fidelity to live runs is tested head to
    head.)"""
    # every draft accepted: no per-request randomness, so both must agree exactly
    model = (
        "--hardware",
        "llama3.1-8b-h100",
        "--accept-rate",
        "1",
        "--max-running-requests",
        "256",
    )
    servers: dict[Pool, EmulatorConfig] = {
        pool: emulator_config("--mode", pool, *model) for pool in ("spec", "base")
    }
    plan = ReplayPlan(
        Trace("steady", (Phase(60.0, 1),)),
        synthetic(128, 128),
        servers,
        backends={"spec": ("http://spec:1",), "base": ("http://base:2",)},
    )
    expected = predict(servers["base"], [1], 128, 128).levels[0]
    for pool in servers:
        speed = expected.spec if pool == "spec" else expected.base
        records = replay(plan, AlwaysPolicy(pool))
        tpot = [t for r in records if (t := r.tpot()) is not None]
        assert len(tpot) > 50
        assert 1.0 / statistics.median(tpot) == pytest.approx(speed.per_request, rel=0.002)
        assert {r.served_by for r in records} == {f"{pool}:{pool}:{1 if pool == 'spec' else 2}"}


FITTED = ("--hardware", "kimi-k2.5-8x-pcie-fitted")  # one crossover, near 5


async def test_a_day_replays_in_seconds_with_the_oracles_gap(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    code, _, stderr = await run(
        "emulate",
        *FITTED,
        "--max-running-requests",
        "256",
        "--predict",
        "1,2,4,6,8,12,16",
        "--input-len",
        "128",
        "--output-len",
        "128",
        "--profile",
        str(profile),
    )
    assert code == 0, stderr
    started = time.monotonic()
    code, stdout, stderr = await run(
        "bench",
        "compare",
        "--offline",
        "--profile",
        str(profile),
        "--trace",
        "poisson-day",
        "--peak",
        "16",
        "--phase-seconds",
        "3",
        "--policies",
        "crossover,expected-latency",
        "--time-scale",
        "0.1",
        *FITTED,
        "--max-running-requests",
        "256",
        "--input-len",
        "128",
        "--output-len",
        "128",
        "--out",
        str(tmp_path / "day"),
        "--plot",
        str(tmp_path / "day.png"),
    )
    assert code == 0, stderr
    assert time.monotonic() - started < 120  # a day of traffic, about 1,500 requests a policy
    results = json.loads((tmp_path / "day" / "compare.json").read_text())
    assert results["mode"] == "offline" and len(results["trace"]["phases"]) == 24
    policies = results["policies"]
    assert list(policies) == [
        "crossover",
        "expected-latency",
        "always-spec",
        "always-base",
        "oracle",
    ]
    counts = {p: d["overall"]["requests"] for p, d in policies.items()}
    assert max(counts.values()) - min(counts.values()) <= 3  # the same arrivals for each
    choice = results["oracle"]["choice"]
    assert choice[3] == "spec" and choice[15] == "base"  # night and the afternoon peak
    gap = results["gap"]
    assert gap["always-base"]["tpot"] > 0.05  # never speculating wastes the quiet hours
    assert gap["crossover"]["tpot"] < gap["always-spec"]["tpot"]
    assert gap["crossover"]["tpot"] < gap["always-base"]["tpot"]
    assert "gap to oracle" in stdout and "crossover" in stdout
    assert (tmp_path / "day.png").read_bytes()[:4] == b"\x89PNG"


async def test_offline_errors_are_clear(tmp_path: Path) -> None:
    config = tmp_path / "router.toml"
    config.write_text('spec = ["http://127.0.0.1:1"]\nbase = ["http://127.0.0.1:2"]\n')
    code, _, stderr = await run(
        "bench",
        "compare",
        "--offline",
        "--router-config",
        str(config),
        "--trace",
        "poisson-day",
        "--peak-rate",
        "0",
        "--out",
        str(tmp_path / "x"),
    )
    assert code == 2 and "poisson-day needs --peak-rate" in stderr
    code, _, stderr = await run(
        "bench",
        "compare",
        "--offline",
        "--router-config",
        str(config),
        "--policies",
        "expected-latency",
        "--out",
        str(tmp_path / "x"),
    )
    assert code == 2 and "needs a profile" in stderr
    code, _, stderr = await run("bench", "compare", "--out", str(tmp_path / "x"))
    assert code == 2 and "needs --router-config" in stderr
