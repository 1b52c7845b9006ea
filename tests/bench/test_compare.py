"""``specroute bench compare``: one trace through router processes, policy by policy."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from specroute.bench.compare import PolicySpec, kept_time, policy_summary, render, render_row
from specroute.cli import parser
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.trace import Phase, Trace, TraceError, load_trace, named_trace
from specroute.policies.registry import REGISTRY
from specroute.router.settings import RouterSettings
from specroute.serve_command import given_settings
from tests.processes import emulator_pair
from tests.profiler.test_bench import run

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
    with pytest.raises(TraceError, match="phase 0 needs seconds and one of concurrency or rate"):
        load_trace(path)
    path.write_text(json.dumps([{"seconds": 5, "concurrency": 2, "rate": 1}]))
    with pytest.raises(TraceError, match="one of concurrency or rate"):
        load_trace(path)
    path.write_text(json.dumps([{"seconds": 2, "rate": 5}, {"seconds": 1, "concurrency": 2}]))
    mixed = load_trace(path)
    assert [p.load for p in mixed.phases] == ["5/s", "2"] and mixed.peak == 2


def test_poisson_day() -> None:
    with pytest.raises(TraceError, match="--peak-rate > 0"):
        named_trace("poisson-day", 16, 10)
    day = named_trace("poisson-day", 16, 10, peak_rate=20)
    rates = [p.rate or 0 for p in day.phases]
    assert len(rates) == 24 and max(rates) == 20 and rates.index(20) == 15  # busiest at 15:00
    assert min(rates) == pytest.approx(2) and rates.index(min(rates)) == 3
    arrivals = day.arrivals(seed=1)
    assert arrivals == day.arrivals(seed=1) != day.arrivals(seed=2)
    assert arrivals == sorted(arrivals) and arrivals[0] > 0 and arrivals[-1] < day.seconds
    expected = sum(rates) * 10
    assert abs(len(arrivals) - expected) < 4 * expected**0.5  # Poisson: within four sigma
    busiest = sum(1 for t in arrivals if 150 <= t < 160)
    quietest = sum(1 for t in arrivals if 30 <= t < 40)
    assert busiest > 4 * quietest


async def test_compare_runs_each_policy_on_the_same_trace(tmp_path: Path) -> None:
    profile = tmp_path / "profile.json"
    profile.write_text(
        json.dumps({"schema": "specroute.profile/v1", "crossover": {"value": 4.5, "ci": [4, 5]}})
    )
    async with emulator_pair(*FLAGS) as (spec, base):
        config = tmp_path / "router.toml"
        config.write_text(f'spec = ["{spec}"]\nbase = ["{base}"]\nprofile = "{profile}"\n')
        code, stdout, stderr = await run(
            "bench",
            "compare",
            "--router-config",
            str(config),
            "--trace",
            "steps",
            "--peak",
            "8",
            "--phase-seconds",
            "2",
            "--output-len",
            "32",
            "--input-len",
            "64",
            "--slo",
            "tpot=1",
            "--out",
            str(tmp_path / "cmp"),
            "--plot",
            str(tmp_path / "cmp.png"),
        )
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
        assert isinstance(data["emulator_lag"], float)  # the backends' clocks were read
        assert 0 <= data["elsewhere"] < 1  # and their requests' own times beside the clients'
        # and at each phase's end
        assert all(isinstance(row["emulator_lag"], float) for row in data["phases"])
    assert results["kept_time"] in (True, False)
    assert "a request's time elsewhere than in the servers" in stdout
    assert "overall:" in stdout and "crossover" in stdout
    assert (tmp_path / "cmp.png").read_bytes()[:4] == b"\x89PNG"


def test_a_phase_that_fell_behind_is_a_run_that_did_not_keep_its_time() -> None:
    """Over the run the servers kept their time (1%), but in its heavy phase they ran 20%
    behind: the comparison did not keep its time, and says by how much; a run whose phases
    were not read (made before they were) is judged by its whole run."""
    figures = ("tpot_ms_p50", "tpot_ms_p99", "ttft_ms_p50", "output_tps", "goodput_rps")
    overall = dict.fromkeys([*figures, "spec_share"])
    run: dict[str, Any] = {"emulator_lag": 0.01, "elsewhere": 0.02, "overall": overall}
    phases = [{"emulator_lag": 0.0}, {"emulator_lag": 0.2}, {"emulator_lag": 0.01}]
    late: dict[str, Any] = {"policies": {"always-base": run | {"phases": phases}}}
    assert kept_time(late) is False
    late |= {"kept_time": False, "trace": {"name": "ramp", "phases": []}}
    assert "NOT KEPT TIME: the emulators ran 20% behind" in render(late)
    assert kept_time({"policies": {"always-base": run | {"phases": [{"tpot_ms_p50": 1.0}]}}})
    unread = run | {"emulator_lag": None, "phases": [{"emulator_lag": None}]}
    assert kept_time({"policies": {"always-base": unread}}) is None


def test_the_overall_median_per_phase_weighs_phases_by_their_time() -> None:
    """Five fast requests in a 1 s phase, one slow one in a 3 s phase: over all requests the
    median is the fast one; phase by phase, over the trace's time, (1 x 1 + 3 x 4) / 4 ms."""

    def record(phase: int, start: float, tpot: float) -> RequestRecord:
        chunks = [(start + 0.01 + i * tpot, 1) for i in range(11)]
        return RequestRecord("p", 4, phase, start, start + 0.01, chunks[-1][0], chunks)

    trace = Trace("t", (Phase(1, 4), Phase(3, 4)))
    records = [*(record(0, 0.1 * i, 0.001) for i in range(5)), record(1, 1.5, 0.004)]
    summary = policy_summary(trace, records, 0.0, 4.0, {})
    assert summary["overall"]["tpot_ms_p50"] == pytest.approx(1)
    assert [row["tpot_ms_p50"] for row in summary["phases"]] == pytest.approx([1, 4])
    assert summary["overall"]["tpot_ms_p50_phases"] == pytest.approx(3.25)
    assert render_row("p", summary["overall"]).endswith(", TPOT p50 per phase 3.25 ms")
    assert "per phase" not in render_row("p", summary["phases"][0])  # a phase has one median
    empty = policy_summary(trace, [], 0.0, 4.0, {})["overall"]
    assert empty["tpot_ms_p50_phases"] is None and empty["requests"] == 0


async def test_rate_phases_are_played_open_loop_through_the_router(tmp_path: Path) -> None:
    """Requests are sent at their arrival times whether or not earlier ones have ended, and
    the offline replay of the same trace meets exactly the same arrivals."""
    trace = tmp_path / "burst.json"
    trace.write_text(json.dumps([{"seconds": 1.5, "rate": 4}, {"seconds": 1.5, "rate": 40}]))
    config = tmp_path / "router.toml"
    async with emulator_pair(*FLAGS) as (spec, base):
        config.write_text(f'spec = ["{spec}"]\nbase = ["{base}"]\ncrossover = 4\n')
        code, _, stderr = await run(
            "bench",
            "compare",
            "--router-config",
            str(config),
            "--trace",
            str(trace),
            "--policies",
            "crossover",
            "--output-len",
            "32",
            "--input-len",
            "64",
            "--out",
            str(tmp_path / "live"),
        )
    assert code == 0, stderr
    arrivals = load_trace(trace).arrivals()
    records = [json.loads(line) for line in (tmp_path / "live" / "requests.jsonl").open()]
    assert len(records) == len(arrivals) > 40
    starts = sorted(r["start"] for r in records)
    offsets = [b - a for a, b in itertools.pairwise(starts)]
    planned = [b - a for a, b in itertools.pairwise(arrivals)]
    assert sum(abs(x - y) for x, y in zip(offsets, planned, strict=True)) / len(planned) < 0.01
    live = json.loads((tmp_path / "live" / "compare.json").read_text())["policies"]["crossover"]
    calm, busy = live["phases"]
    assert calm["spec_share"] == 1 and busy["spec_share"] < 1  # the burst overlaps requests
    code, _, stderr = await run(
        "bench",
        "compare",
        "--offline",
        "--router-config",
        str(config),
        "--trace",
        str(trace),
        "--policies",
        "crossover",
        "--output-len",
        "32",
        "--input-len",
        "64",
        *FLAGS[:4],
        "--out",
        str(tmp_path / "offline"),
    )
    assert code == 0, stderr
    offline = json.loads((tmp_path / "offline" / "compare.json").read_text())["policies"]
    assert len(arrivals) - 3 <= offline["crossover"]["overall"]["requests"] <= len(arrivals)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_policy_parameter_reaches_a_live_router(name: str) -> None:
    """A live comparison gives its router each policy's parameters as ``serve`` flags: every
    parameter of every policy has one, and it lands in the settings the policy is built
    from (a missing flag used to stop the router from starting)."""
    values = {
        "crossover": "21.5",
        "topology": "partitioned",
        "hysteresis": "2.5",
        "accept_max_age": "30.5",
        "probe_share": "0.25",
        "context": "off",
    }
    keys = sorted(REGISTRY[name].keys())
    assert set(keys) <= set(values), f"a test value for each of {keys}"
    spec = PolicySpec.parse(":".join([name, *(f"{k}={values[k]}" for k in keys)]))
    args = parser().parse_args(
        ["serve", "--spec", "http://a:1", "--base", "http://b:2", *spec.serve_flags()]
    )
    given = RouterSettings(**given_settings(args)).policy_params()
    assert {k: str(v) for k, v in given.items()} == {k: values[k] for k in keys}
