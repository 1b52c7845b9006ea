"""The chaos benchmark: mixed requests through a router process while its emulator
processes are killed, started again and given faults, every request accounted for and the
router's counters in agreement with the client's; and its command line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specroute.bench.chaos import ChaosPlan, Event, run_chaos
from specroute.cli import main

# Backends 0 and 1 are speculative, 2 and 3 plain. Requests come at about 150 a second
# here, and a backend killed is back about 1 s after its down time.
SCHEDULE = (
    Event(50, 1, "faults", ("stall_first:2,count=2",), seed=1),  # streams 504, plain late
    Event(100, 0, "kill", down=0.5),  # streams there break, the rest is retried
    Event(150, 3, "faults", ("cut_mid:2,count=3",), seed=2),  # broken streams
    Event(200, 1, "faults", ("status:500,count=2",), seed=3),  # relayed as it is
    Event(250, 2, "faults", ("refuse,count=3",), seed=4),  # retried elsewhere
    Event(300, 3, "faults", ("stall_mid:1,seconds=1.5,count=2",), seed=5),  # idle timeout
    Event(450, 2, "kill", down=0.5),
    Event(500, 3, "faults", ("status:503,count=3",), seed=6),  # busy: retried
    Event(550, 0, "faults", ("cut_mid:0,count=3",), seed=7),  # before the first byte: retried
    Event(650, 1, "faults", ("stall_first:6,count=2",), seed=8),  # past the deadline: 504
    Event(800, 1, "faults", ("crash:2,count=1",), seed=9),  # exits mid-stream, started again
)


async def test_a_short_chaos_run_loses_nothing_and_the_counters_agree() -> None:
    result = await run_chaos(ChaosPlan(requests=1000, concurrency=16, seed=1, schedule=SCHEDULE))
    tally, router = result.tally, result.router
    verdicts = tally["verdicts"]
    assert tally["count"] == 1000 == sum(verdicts.values())  # each ended once
    assert verdicts.get("lost", 0) == 0, tally["lost"]  # no hang, no silent truncation
    assert all(problem is None for problem in result.checks.values()), result.checks
    # the same agreements, spelled out
    assert router["inflight"] == 0 and router["router_errors"] == 0
    retries = router["decisions"].get("retry", 0)
    refused, undecided = sum(tally["refused"].values()), result.races["undecided"]
    # a decision per request and per retry, but for cancels that left before the decision
    assert router["decisions_total"] == tally["count"] + retries - undecided
    assert 0 <= undecided <= verdicts["cancelled"]
    assert sum(router["requests"].values()) == tally["count"] - refused - undecided  # once each
    for status, client in tally["router_statuses"].items():  # exact but for cancels that
        seen = router["requests"].get(status, 0)  # raced an answer's end (counted as it)
        assert seen <= client if status == "cancelled" else seen >= client
    # and the chaos happened: backends died and came back, answers broke, requests moved
    assert sum(1 for e in result.events if e["action"] == "kill" and e["done"]) >= 1
    assert sum(result.restarts.values()) >= 2  # a kill and the crash at least
    assert retries >= 1 and router["upstream_errors"].get("connect", 0) >= 1
    assert verdicts.get("broken", 0) >= 1 and verdicts.get("garbled", 0) == 0
    assert verdicts["answered"] >= 800 and verdicts["cancelled"] >= 1


def test_the_command_writes_its_tally_and_says_how_it_went(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "chaos.json"
    argv = [
        "bench",
        "chaos",
        "--requests",
        "200",
        "--concurrency",
        "8",
        "--events",
        "4",
        "--spec-backends",
        "1",
        "--base-backends",
        "1",
        "--out",
        str(out),
    ]
    code = main(argv)
    said = capsys.readouterr()
    document = json.loads(out.read_text())
    assert code == 0 and document["ok"]
    assert all(p is None for p in document["checks"].values())
    assert document["tally"]["count"] == 200 and len(document["plan"]["schedule"]) == 4
    assert said.err.count("chaos: ") >= 10  # a progress line every twentieth
    assert "decisions" in said.out and "nothing lost" in said.out
