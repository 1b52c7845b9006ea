"""``specroute bench compare``: one trace through router processes, policy by policy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.trace import TraceError, load_trace, named_trace
from tests.processes import specroute
from tests.test_bench import run

FLAGS = ("--time-scale", "0.1", "--max-running-requests", "64", "--stream-interval", "4")


def test_named_traces_and_files(tmp_path: Path) -> None:
    ramp = named_trace("ramp", 8, 2.0)
    assert [p.concurrency for p in ramp.phases] == [1, 2, 4, 8, 4, 2, 1]
    assert ramp.seconds == 14 and ramp.peak == 8
    assert ramp.phase_at(0) == 0 and ramp.phase_at(13.9) == 6 and ramp.phase_at(14) is None
    assert [p.concurrency for p in named_trace("steps", 6, 1).phases] == [1, 6, 1, 6]
    path = tmp_path / "day.json"
    path.write_text(
        json.dumps([{"seconds": 5, "concurrency": 3}, {"seconds": 1, "concurrency": 0}])
    )
    assert load_trace(path).phases[1].concurrency == 0
    path.write_text(json.dumps([{"seconds": 5}]))
    with pytest.raises(TraceError, match="phase 0 needs seconds and concurrency"):
        load_trace(path)


async def test_compare_runs_each_policy_on_the_same_trace(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"schema": "specroute.profile/v1",
                                   "crossover": {"value": 4.5, "ci": [4, 5]}}))  # fmt: skip
    async with (
        specroute("emulate", "--mode", "spec", *FLAGS) as (spec, _),
        specroute("emulate", "--mode", "base", *FLAGS) as (base, _),
    ):
        config = tmp_path / "router.toml"
        config.write_text(f'spec = ["{spec}"]\nbase = ["{base}"]\nprofile = "{profile}"\n')
        code, stdout, stderr = await run(
            "bench", "compare", "--router-config", str(config), "--trace", "steps",
            "--peak", "8", "--phase-seconds", "2", "--output-len", "32", "--input-len", "64",
            "--slo", "tpot=1", "--out", str(tmp_path / "cmp"),
            "--plot", str(tmp_path / "cmp.png"),
        )  # fmt: skip
    assert code == 0, stderr
    results = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    policies = results["policies"]
    assert list(policies) == ["crossover", "always-spec", "always-base"]
    assert policies["always-spec"]["overall"]["spec_share"] == 1
    assert policies["always-base"]["overall"]["spec_share"] == 0
    low, high = policies["crossover"]["phases"][0], policies["crossover"]["phases"][1]
    assert (low["concurrency"], high["concurrency"]) == (1, 8)
    assert low["spec_share"] == 1 and high["spec_share"] < 0.7  # 4 of 8 at most speculate
    for data in policies.values():
        assert data["overall"]["failed"] == 0 and data["overall"]["requests"] > 10
        assert all(row["tpot_ms_p50"] is not None for row in data["phases"])
        assert data["overall"]["goodput_rps"] > 0
    assert "overall:" in stdout and "crossover" in stdout
    assert (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"
