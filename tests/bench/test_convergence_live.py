"""The convergence bench live (``specroute bench convergence --live``): the pair as emulator
processes sharing one GPU group, a router in front with ``--online adopt`` and its time
settings scaled, the Azure trace's requests sent through it, or the ramp's clients. A short
window: what the live router serves and learns agrees with the offline replay of the same
requests (the proof's own runs are the committed bench JSON, run on a machine with the
cores for it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specroute.bench.convergence import converge, defaults
from specroute.bench.convergence_live import converge_live
from specroute.cli import main
from specroute.loadgen import lag
from tests.bench.test_convergence import DENSE

pytestmark = pytest.mark.alone


def test_a_live_run_serves_and_routes_as_the_offline_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "live.json"
    given = ["--starts", "4x high", "--traffic", "azure", "--window", "0+300"]
    code = main(["bench", "convergence", *DENSE, *given, "--live", "0.1", "--out", str(out)])
    said = capsys.readouterr()
    document = json.loads(out.read_text())
    (offline,), (live,) = document["runs"], document["live"]
    kept = lag.Kept(live["lag"], live["elsewhere"])
    assert kept.elsewhere is not None  # the servers' own times were read
    if not kept.kept:
        assert code == 1 and f"NOT KEPT TIME: {kept.said()}" in said.err
        pytest.skip(kept.said())
    assert code == 0 and "live" in said.out and "NOT KEPT TIME" not in said.out + said.err
    # every request of the window, live too (the one arriving at the window's last instant,
    # sent live and cancelled there, ends the offline replay before it is sent)
    assert live["requests"] - offline["requests"] in (0, 1)
    # a request still decoding at the window's end is cancelled, its tokens not counted: seen
    # 0.92 to 1.0 times the replay's (the replay's own draws, 0.99 to 1.06 times seed 0's)
    assert live["tps"] == pytest.approx(offline["tps"], rel=0.15)
    # a request's mean time at this load moves with the draw of the emulator's noise and
    # drafts: the offline replay's, over the seeds 0 to 13, 0.71 to 1.15 times seed 0's
    # (3.83 to 6.21 s against 5.42), and a live run is a draw of its own (seen 0.75 to 1.17)
    assert 0.6 * offline["latency"] < live["latency"] < 1.4 * offline["latency"]
    assert (
        live["started_at"]
        == offline["started_at"]
        == pytest.approx(4 * offline["truth"]["crossover"])
    )
    # a window too short to be sure of a crossing: both route by the start throughout
    assert live["routed_at_end"] == offline["routed_at_end"] == live["started_at"]
    assert live["explored"] <= defaults().online.explore_share * live["requests"] + 4


async def test_the_ramp_live_plays_its_clients_phase_by_phase(tmp_path: Path) -> None:
    """One cycle of the ramp (8 emulated minutes) at a twentieth of real time: the clients
    step up and down through the router and the records come back in emulated seconds.
    A closed loop at this time scale loses to the client's and the router's own time (each
    wall millisecond is twenty emulated ones): on two cores they took 24% of a request's
    time (9% at a tenth of real time, 2% at a fifth), and the run says it did not keep its
    time. Where it did, its requests and tok/s are held to the replay's."""
    live, kept = await converge_live(DENSE, "4x high", 1, 0.05, tmp_path)
    offline = converge(DENSE, "4x high", 1, priced=False)
    assert (live.traffic, live.seconds) == ("ramp", offline.seconds) == ("ramp", 480.0)
    assert kept.elsewhere is not None and 0 < live.requests <= offline.requests * 1.1
    # one cycle is seldom enough to be sure of a crossing: offline it routes by the start
    # throughout. Live, where a wall millisecond is twenty emulated ones and blurs a level's
    # time per token, where it ends is not asserted: at its start in most runs, once 22.3
    # (inside the truth), once 15.0 (a bound a level short of it). What live learning does
    # is measured at a tenth of real time in the committed live runs, not here.
    assert offline.routed_at_end == live.started_at
    if not kept.kept:
        pytest.skip(kept.said())
    assert live.requests >= 0.6 * offline.requests
    assert live.tps == pytest.approx(offline.tps, rel=0.3)
