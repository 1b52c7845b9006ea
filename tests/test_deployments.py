"""The head-to-head of what a team could deploy (``specroute bench deployments``) on a short
window of the Azure trace: every contender serves the same requests; the pair's servers split
the memory one server would have, evenly; the adaptive server with the written schedule
drafts where the profile says, so below the crossover it is the fixed-depth server; the
command writes its table and JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from specroute.bench.deployments import head_to_head, render, serve, setup
from specroute.cli import main
from specroute.loadgen.request_trace import azure_conversations
from specroute.model_flags import config_from_flags

FLAGS = [
    "--hardware",
    "llama3.1-8b-h100",
    "--max-running-requests",
    "256",
    "--cuda-graph-max-bs",
    "256",
]


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    window = azure_conversations().window(600, 40)
    config = config_from_flags([*FLAGS, "--mem-fraction-static", "auto"], "spec")
    return head_to_head(config, window, [0.5, 1.2], {"ttft": 2.0, "tpot": 0.05})


def test_every_contender_serves_the_same_requests_to_their_end(document: dict[str, Any]) -> None:
    rows = document["utilisations"]
    assert set(rows) == {"0.5", "1.2"}
    for row in rows.values():
        served = {name: row[name]["requests"] for name in document["contenders"]}
        assert len(set(served.values())) == 1, served
        assert all(row[name]["unfinished"] == 0 for name in served)


def test_below_the_crossover_the_written_schedule_is_the_fixed_depth(
    document: dict[str, Any],
) -> None:
    """At half the plain server's capacity every batch is below the crossover, where the
    written schedule drafts at the calibrated depth: the same steps as the fixed server's,
    so the same figures; the pair sends everything to its speculative server there, which
    has less memory but never runs out of it."""
    row = document["utilisations"]["0.5"]
    assert row["adaptive-calibrated"] == row["eagle"]
    assert row["specroute"]["spec_share"] == 1.0
    assert row["plain"]["tpot_ms_p50"] > row["eagle"]["tpot_ms_p50"]


def test_the_pair_splits_one_servers_memory_evenly(tmp_path: Path) -> None:
    config = config_from_flags([*FLAGS, "--mem-fraction-static", "auto"], "spec")
    built = setup(config, 1024, 128, tmp_path)
    plain, pair = built.memory["plain"][0], built.memory["specroute"]
    eagle = built.memory["eagle"][0]
    assert plain is not None and eagle is not None and pair[0] is not None and pair[1] is not None
    assert pair[0] < eagle / 2 and pair[1] < plain / 2  # each loads the weights again
    assert pair[1] * 131072 == pytest.approx(pair[0] * (131072 + 4096), rel=0.1)
    assert built.schedule == json.loads((tmp_path / "adaptive.json").read_text())
    served = serve(built.contenders[0], azure_conversations().window(600, 5), 60.0)
    assert served and all(r.ok for r in served)


def test_the_command_prints_its_table_and_keeps_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "deployments.json"
    argv = ["bench", "deployments", *FLAGS, "--window", "600+20", "--utilisation", "0.5"]
    assert main([*argv, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert render(document) in printed
    assert document["contenders"] == [
        "plain",
        "eagle",
        "adaptive",
        "adaptive-calibrated",
        "specroute",
    ]
    assert main(["bench", "deployments", *FLAGS, "--window", "99999+10"]) == 2


def test_partitioned_each_deployment_gets_two_groups_and_the_pair_all_of_its_memory(
    tmp_path: Path,
) -> None:
    """On two GPU groups each one-server deployment runs twice behind least-load placement,
    and the pair's servers each have a group, with all of its memory."""
    config = config_from_flags([*FLAGS, "--mem-fraction-static", "auto"], "spec")
    shared = setup(config, 1024, 128, tmp_path)
    built = setup(config, 1024, 128, tmp_path, "partitioned")
    assert all(len(c.servers) == 2 for c in built.contenders)
    assert built.memory["specroute"] == [built.memory["eagle"][0], built.memory["plain"][0]]
    assert built.capacity_tps == pytest.approx(2 * shared.capacity_tps)
    window = azure_conversations().window(600, 10).scaled(2)
    spread = serve(built.contenders[0], window, 60.0)
    assert {r.served_by for r in spread} == {"base:0", "base:1"}
