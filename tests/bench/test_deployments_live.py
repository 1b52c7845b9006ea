"""One live row of ``specroute bench deployments`` per topology, short (Llama-3.1-8B on one
H100's GPU group, the Kimi-K2.5 case study's model a node each): each contender's servers
as emulator processes behind a router process, the trace's requests sent by their arrival
times. Every contender serves every request live, and its figures agree with the offline
replay of the same requests on the same servers (generous bounds: the live run routes by
polled load, and its clock is the machine's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specroute.bench.deployments import ORACLE, kept_time, worst
from specroute.cli import main
from tests.bench.test_deployments import MODELS

pytestmark = pytest.mark.alone


@pytest.mark.parametrize("model", ["llama3.1-8b-h100", "kimi-k2.5-8x-pcie"])
def test_a_live_row_agrees_with_the_offline_one(model: str, tmp_path: Path) -> None:
    flags, topology = MODELS[model]
    out = tmp_path / "live.json"
    argv = ["bench", "deployments", *flags, "--topology", topology, "--window", "600+15"]
    argv += ["--utilisation", "0.5", "--live", "0.5", "--time-scale", "0.1", "--out", str(out)]
    code = main(argv)
    document = json.loads(out.read_text())
    if kept_time(document) is False:
        assert code == 1
        pytest.skip(worst(document).said())
    assert code == 0
    row = document["utilisations"]["0.5"]
    live = row["live"]
    assert live["time_scale"] == 0.1 and live["lag"] is not None
    names = [*document["contenders"], ORACLE]
    for name in names:
        offline, played = row[name], live[name]
        # a request still running at twice the trace's span is cut off, live as offline
        assert played["failed"] == 0 and played["unfinished"] <= offline["unfinished"] + 2, name
        assert played["requests"] >= offline["requests"] - 2 > 10, name
        # a contender the replay finds overloaded (under half the best goodput: the Kimi
        # case's specroute-adaptive) is overloaded live too; its tok/s is its queue's tail's,
        # which a queue's growth makes a matter of chance (live 0.73 times the replay's once)
        keys = ["tpot_ms_p50"]
        if overloaded(row, names, name):
            assert overloaded(live, names, name), (name, played, offline)
        else:
            keys.append("output_tps")
        for key in keys:
            assert played[key] == pytest.approx(offline[key], rel=0.25), (name, key)
        assert played["ttft_ms_p50"] == pytest.approx(offline["ttft_ms_p50"], rel=0.5, abs=60)


def overloaded(row: dict[str, Any], names: list[str], name: str) -> bool:
    """Whether ``name``'s goodput is under half the best of ``names`` in ``row``."""
    return bool(row[name]["goodput_rps"] < 0.5 * max(row[n]["goodput_rps"] for n in names))
