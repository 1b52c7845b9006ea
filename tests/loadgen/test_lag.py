"""A sweep that cannot keep its time says so and concludes nothing: each run reads how far
its emulated server fell behind its time scale, leaves out a run that lagged over 5%, tries
it again, and stops the sweep if it lags again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specroute.loadgen.lag import LIMIT, Clock, Kept, elsewhere, lag, overall, shown
from tests.processes import emulator_pair
from tests.profiler.test_bench import run


@pytest.mark.parametrize(
    ("before", "after", "expected"),
    [
        (Clock(10.0, 10.5), Clock(12.0, 12.6), 0.05),
        (Clock(0.0, 0.0), Clock(1.0, 2.4), 1.4),
        (Clock(1.0, 1.0), Clock(1.0, 1.2), None),  # no step between them
        (None, Clock(1.0, 1.0), None),  # a real engine: no clock
    ],
    ids=["on time", "2.4x slow", "no step", "no clock"],
)
def test_lag_is_actual_over_intended_step_time(
    before: Clock | None, after: Clock | None, expected: float | None
) -> None:
    found = lag(before, after)
    assert found == expected if expected is None else found == pytest.approx(expected)


def test_a_request_s_time_elsewhere_is_what_its_client_timed_past_the_servers_own() -> None:
    """Two servers finished 30 requests in 15 wall seconds between the readings, 0.5 s
    each, 5 emulated seconds at a tenth of real time; a client that timed them at 5.5
    emulated seconds on average lost 1/11 of it elsewhere. A real engine's clock, and a
    run with no request finished or none timed, say nothing."""
    before = [Clock(0.0, 0.0, 100.0, 10.0), Clock(0.0, 0.0, 0.0, 0.0), None]
    after = [Clock(9.0, 9.0, 110.0, 30.0), Clock(9.0, 9.0, 5.0, 10.0), None]
    found = elsewhere(before, after, 5.5, 0.1)
    assert found == pytest.approx(1 / 11)
    assert elsewhere(before, after, 4.0, 0.1) == 0.0  # the client timed less: none lost
    assert elsewhere(before, before, 5.5, 0.1) is None
    assert elsewhere(before, after, 0.0, 0.1) is None
    assert Kept(0.01, found).said().startswith("the router and the client took 9%")
    assert not Kept(0.01, found).kept and Kept(0.01, 0.02).kept and Kept(None, None).kept
    assert Kept(LIMIT * 2, found).said().startswith("the emulators ran 10% behind")
    assert Kept(0.0, 0.0).said() == ""


def test_servers_lag_together_each_weighed_by_its_steps() -> None:
    """A server that served the run on time and an idle one woken for 10 ms of steps that
    took 25: together on time within 1%, not 150% late; a real engine has no clock."""
    busy = (Clock(0.0, 0.0), Clock(20.0, 20.0))
    idle = (Clock(5.0, 5.0), Clock(5.01, 5.025))
    together = overall([busy[0], idle[0], None], [busy[1], idle[1], None])
    assert together == pytest.approx(0.015 / 20.01)
    assert lag(*idle) == pytest.approx(1.5)
    assert overall([None], [None]) is None and overall([idle[1]], [idle[1]]) is None


def test_a_lag_is_shown_signed_and_never_as_minus_zero() -> None:
    assert [shown(x) for x in (0.0123, -0.00004, 0.00004, -0.02, None)] == [
        "+1.2%",
        "0.0%",
        "0.0%",
        "-2.0%",
        "-",
    ]


async def test_a_sweep_that_keeps_time_records_its_lag(tmp_path: Path) -> None:
    async with emulator_pair("--time-scale", "0.5") as (spec, base):
        code, _, stderr = await run(
            "bench",
            "sweep",
            "--spec",
            spec,
            "--base",
            base,
            "--concurrency",
            "1",
            "--repeats",
            "1",
            "--requests-per-level",
            "4",
            "--input-len",
            "64",
            "--output-len",
            "16",
            "--out",
            str(tmp_path),
        )
    assert code == 0, stderr
    runs = [json.loads(line) for line in (tmp_path / "levels.jsonl").read_text().splitlines()]
    assert len(runs) == 2 and all(abs(r["emulator_lag"]) <= 0.05 for r in runs), runs


async def test_a_sweep_whose_server_falls_behind_stops_saying_so(tmp_path: Path) -> None:
    """At a thousandth of real time no machine keeps 64 streams' steps on time."""
    async with emulator_pair("--time-scale", "0.001", "--max-running-requests", "64") as (
        spec,
        base,
    ):
        code, _, stderr = await run(
            "bench",
            "sweep",
            "--spec",
            spec,
            "--base",
            base,
            "--concurrency",
            "64",
            "--repeats",
            "1",
            "--requests-per-level",
            "64",
            "--input-len",
            "64",
            "--output-len",
            "64",
            "--out",
            str(tmp_path),
        )
    assert code == 2
    assert "behind its time scale at concurrency 64" in stderr
    assert "the run is left out and tried again" in stderr
    assert "twice; nothing is concluded from it" in stderr
    assert (tmp_path / "levels.jsonl").read_text() == ""  # no lagging run was kept


async def test_a_comparison_whose_servers_fall_behind_says_so(tmp_path: Path) -> None:
    """``bench compare`` reads the clocks of the backends its router lists around each
    policy's run, records the worst lag, and flags the comparison as not keeping time."""
    trace = tmp_path / "busy.json"
    trace.write_text(json.dumps([{"seconds": 1.5, "concurrency": 32}]))
    async with emulator_pair("--time-scale", "0.001", "--max-running-requests", "64") as (
        spec,
        base,
    ):
        config = tmp_path / "router.toml"
        config.write_text(f'spec = ["{spec}"]\nbase = ["{base}"]\ncrossover = 4\n')
        code, stdout, stderr = await run(
            "bench",
            "compare",
            "--router-config",
            str(config),
            "--trace",
            str(trace),
            "--policies",
            "always-spec,always-base",
            "--input-len",
            "64",
            "--output-len",
            "64",
            "--out",
            str(tmp_path / "cmp"),
        )
    assert code == 0, stderr
    results = json.loads((tmp_path / "cmp" / "compare.json").read_text())
    lags = [p["emulator_lag"] for p in results["policies"].values()]
    assert results["kept_time"] is False and all(x > 0.05 for x in lags), lags
    assert "NOT KEPT TIME" in stdout and "conclude nothing" in stderr


async def test_replicas_whose_servers_fall_behind_say_so(tmp_path: Path) -> None:
    """``bench replicas`` reads both servers' clocks around each run: each row has its
    lag, and a ramp the emulators could not keep time in is flagged."""
    out = tmp_path / "replicas.json"
    code, stdout, stderr = await run(
        "bench",
        "replicas",
        "--replicas",
        "2",
        "--polls",
        "0.25",
        "--seconds",
        "0.3",
        "--time-scale",
        "0.0005",
        "--out",
        str(out),
    )
    assert code == 0, stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 3 and all(r["emulator_lag"] > 0.05 for r in rows), rows
    assert "NOT KEPT TIME" in stdout and "conclude nothing" in stderr
