"""Emulated servers on shared GPUs (``--share-gpus FILE``): their steps take turns, live and
in the offline replay; servers apart run as before."""

from __future__ import annotations

import asyncio
import statistics
from pathlib import Path

import aiohttp
import pytest

from specroute.bench.compare import summarise
from specroute.bench.replay import ReplayPlan, replay
from specroute.cli import main
from specroute.emulator.gpus import SharedGpus
from specroute.loadgen.client import send
from specroute.loadgen.dataset import synthetic
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.trace import Phase, Trace
from specroute.model_flags import config_from_flags
from specroute.policies.static import RoundRobinPolicy
from specroute.policies.view import POOLS
from tests.processes import emulator_pair

MODEL = ("--hardware", "llama3.1-8b-h100", "--accept-length", "2.0")
STREAMS, TOKENS = 4, 48


def test_a_step_waits_for_the_gpus_another_server_holds(tmp_path: Path) -> None:
    path = tmp_path / "gpus"
    one, other = SharedGpus(path), SharedGpus(path)
    assert one.reserve(100.0, 0.5) == 100.0  # free: at once
    assert other.reserve(100.2, 0.3) == 100.5  # after the first one's step
    assert one.reserve(100.6, 0.1) == 100.8  # and this after that
    assert other.reserve(200.0, 0.1) == 200.0  # free again by then
    assert SharedGpus(path).reserve(1.0, 0.1) == 1.0  # a far-off time is a previous boot's
    for gpus in (one, other):
        gpus.close()


async def _tpot(session: aiohttp.ClientSession, url: str) -> float:
    """The median time per output token of ``STREAMS`` concurrent streams."""
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": "one two three"}],
        "max_tokens": TOKENS,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    records = await asyncio.gather(
        *(
            send(
                session,
                url,
                body,
                RequestRecord("t", STREAMS, 0, asyncio.get_running_loop().time()),
            )
            for _ in range(STREAMS)
        )
    )
    assert all(r.ok for r in records), [r.error for r in records]
    return statistics.median(t for r in records if (t := r.tpot()) is not None)


@pytest.mark.parametrize("shared", [True, False])
async def test_busy_servers_on_shared_gpus_each_run_slower(shared: bool, tmp_path: Path) -> None:
    share = ("--share-gpus", str(tmp_path / "gpus")) if shared else ()
    async with (
        emulator_pair(*MODEL, "--time-scale", "0.5", "--stream-interval", "4", *share) as (
            spec,
            base,
        ),
        aiohttp.ClientSession() as session,
    ):
        alone = await _tpot(session, spec)
        together, _ = await asyncio.gather(_tpot(session, spec), _tpot(session, base))
    # together, a step of each server waits for the other's (offline, this model: 1.7x);
    # apart, the other server's load costs nothing
    if shared:
        assert together / alone > 1.35, (alone, together)
    else:
        assert together / alone < 1.15, (alone, together)


def test_the_replay_shares_gpus_as_the_servers_do() -> None:
    trace = Trace("t", (Phase(4.0, 8, input_len=(128,)),))

    def median_tpot(*flags: str) -> float:
        """Both servers busy at once: requests alternate between them."""
        servers = {pool: config_from_flags((*MODEL, *flags), pool, 0.1) for pool in POOLS}
        plan = ReplayPlan(
            trace,
            synthetic(128, 64),
            servers=servers,
            backends={"spec": ("http://127.0.0.1:1",), "base": ("http://127.0.0.1:2",)},
            output_len=64,
        )
        records = replay(plan, RoundRobinPolicy())
        assert {(r.served_by or "").split(":")[0] for r in records} == set(POOLS)
        result = summarise(records, 0.0, trace.seconds, {})["tpot_ms_p50"]
        assert result is not None
        return float(result)

    apart, shared = median_tpot(), median_tpot("--share-gpus", "g")
    assert 1.35 < shared / apart < 2.2, (apart, shared)


def test_a_prediction_refuses_shared_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["emulate", *MODEL, "--share-gpus", "g", "--predict", "1"]) != 0
    assert "--share-gpus is for servers and replays" in capsys.readouterr().err
