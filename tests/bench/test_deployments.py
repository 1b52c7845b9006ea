"""The head-to-head of what a team could deploy (``specroute bench deployments``) on short
windows of the Azure trace: every contender serves the same requests; the pair's servers each
hold the same memory and keep SGLang's reserve; the adaptive server with the written
schedule drafts where the profile says, so below the crossover it is the fixed-depth server;
the oracle takes each minute from the faster of the plain and EAGLE-3 runs; the matrix of
models, topologies and traffic runs offline; the command writes its table and JSON."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from specroute.bench.contenders import setup
from specroute.bench.deployments import (
    MINUTE,
    ORACLE,
    head_to_head,
    kept_time,
    oracle,
    render,
    standings,
)
from specroute.bench.deployments_plot import plot_deployments
from specroute.bench.offline_contender import serve
from specroute.cli import main
from specroute.emulator.memory import static_gib
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.request_trace import azure_conversations, shaped

FLAGS = [
    "--hardware",
    "llama3.1-8b-h100",
    "--max-running-requests",
    "256",
    "--cuda-graph-max-bs",
    "256",
]
SLO = {"ttft": 2.0, "tpot": 0.05}
# each model as the committed runs deploy it: its flags, and its topology
MODELS = {
    "llama3.1-8b-h100": (FLAGS, "shared"),
    "llama3.1-8b-h200": (["--hardware", "llama3.1-8b-h200", *FLAGS[2:]], "shared"),
    "qwen3-30b-a3b-h200": (["--hardware", "qwen3-30b-a3b-h200", *FLAGS[2:]], "shared"),
    "kimi-k2.5-8x-pcie": (
        ["--hardware", "kimi-k2.5-8x-pcie", "--accept-length", "2.1", *FLAGS[2:4],
         "--cuda-graph-max-bs", "128"],
        "partitioned",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    window = azure_conversations().window(600, 40)
    return head_to_head(FLAGS, window, [0.5, 1.2], SLO)


def test_every_contender_serves_the_same_requests_to_their_end(document: dict[str, Any]) -> None:
    rows = document["utilisations"]
    assert set(rows) == {"0.5", "1.2"}
    for row in rows.values():
        served = {name: row[name]["requests"] for name in [*document["contenders"], ORACLE]}
        assert len(set(served.values())) == 1, served
        assert all(row[name]["unfinished"] == 0 for name in served)
        assert "live" not in row


def test_below_the_crossover_the_written_schedule_is_the_fixed_depth(
    document: dict[str, Any],
) -> None:
    """At half the plain server's capacity every batch is below the crossover, where the
    written schedule drafts at the calibrated depth: the same steps as the fixed server's,
    so the same figures; the pair sends everything to its speculative server there."""
    row = document["utilisations"]["0.5"]
    assert row["adaptive-calibrated"] == row["eagle"]
    assert row["specroute"]["spec_share"] == 1.0
    assert row["plain"]["tpot_ms_p50"] > row["eagle"]["tpot_ms_p50"]


def test_the_rate_puts_the_gpus_at_each_utilisation_and_the_figures_are_drawn(
    document: dict[str, Any], tmp_path: Path
) -> None:
    """The trace's output tokens a second over the plain server saturated is the
    utilisation asked for; the plot draws every column of every contender."""
    window = azure_conversations().window(600, 40)
    outputs = statistics.mean(r.output_tokens for r in window.requests)
    for utilisation, row in document["utilisations"].items():
        offered = row["rate_factor"] * window.rate * outputs
        assert offered == pytest.approx(float(utilisation) * document["capacity_tps"], rel=1e-3)
    pytest.importorskip("matplotlib")
    plot_deployments(document, tmp_path / "deployments.png")
    assert (tmp_path / "deployments.png").stat().st_size > 20_000


def test_a_live_row_that_lagged_says_so(document: dict[str, Any]) -> None:
    """A live row whose servers fell behind their time scale, or whose router and client
    took more than a sliver of a request's time, is flagged, not read."""
    lagged = json.loads(json.dumps(document))
    row = lagged["utilisations"]["0.5"]
    row["live"] = {n: row[n] for n in [*document["contenders"], ORACLE]}
    row["live"] |= {"lag": 0.01, "time_scale": 0.1}
    assert kept_time(lagged) is True and "NOT KEPT TIME" not in render(lagged)
    row["live"]["lag"] = 0.2
    assert kept_time(lagged) is False
    assert "NOT KEPT TIME: the emulators ran 20% behind" in render(lagged)
    # on time, but the router and the client took a tenth of a request's time
    row["live"] |= {"lag": 0.01, "elsewhere": 0.1}
    assert kept_time(lagged) is False
    assert "NOT KEPT TIME: the router and the client took 10%" in render(lagged)
    assert kept_time(document) is None


def test_the_standings_name_the_most_goodput_and_an_overload(document: dict[str, Any]) -> None:
    said = standings(document)
    for utilisation, row in document["utilisations"].items():
        best = said[utilisation]["best"]
        top = row[best]["goodput_rps"]
        assert all(row[n]["goodput_rps"] <= top for n in document["contenders"])
        assert said[utilisation]["specroute"] == pytest.approx(
            row["specroute"]["goodput_rps"] / top, abs=1e-3
        )
    jammed = json.loads(json.dumps(document))
    row = jammed["utilisations"]["0.5"]
    row["rate"] = 3 * max(row[n]["goodput_rps"] for n in document["contenders"])
    assert standings(jammed)["0.5"]["overloaded"] and not said["0.5"]["overloaded"]
    assert "(overloaded)" in render(jammed) and "(overloaded)" not in render(document)


def _latency(records: list[RequestRecord]) -> float:
    return statistics.mean(r.end - r.start for r in records if r.end is not None)


def test_the_oracle_takes_each_minute_from_the_faster_run(tmp_path: Path) -> None:
    built = setup(FLAGS, 1024, 200, tmp_path)
    by_name = {c.name: c for c in built.contenders}
    trace = azure_conversations().window(600, 240).scaled(0.9)
    plain = serve(by_name["plain"], trace, 2 * trace.seconds)
    eagle = serve(by_name["eagle"], trace, 2 * trace.seconds)
    best, minutes = oracle(plain, eagle)
    spanned = {int(r.start // MINUTE) for r in plain}
    assert len(best) == len(trace.requests) and sum(minutes.values()) == len(spanned) > 1
    for minute in spanned:
        mine = [r for r in best if int(r.start // MINUTE) == minute]
        options = [[r for r in run if int(r.start // MINUTE) == minute] for run in (plain, eagle)]
        assert _latency(mine) == min(_latency(o) for o in options)
    assert _latency(best) <= min(_latency(plain), _latency(eagle))


def test_the_pair_s_servers_hold_the_same_memory_and_each_its_reserve(tmp_path: Path) -> None:
    built = setup(FLAGS, 1024, 128, tmp_path)
    plain, eagle = built.memory["plain"][0], built.memory["eagle"][0]
    first, second = built.memory["specroute"]
    assert plain and eagle and first and second
    assert first < eagle / 2 and second < plain / 2  # each loads the weights again
    spec, base = next(c for c in built.contenders if c.name == "specroute").servers
    memory = spec.config.hardware.memory
    assert memory is not None and spec.config.resolved_mem_fraction is not None
    held = static_gib(memory, spec.config.resolved_mem_fraction)
    assert base.config.memory_taken_gib == pytest.approx(held, abs=1e-3)
    later = static_gib(memory, base.config.resolved_mem_fraction or 0, held)
    assert later == pytest.approx(held, rel=0.03)  # the first's CUDA context aside
    assert built.schedule == json.loads((tmp_path / "adaptive.json").read_text())


def test_partitioned_each_deployment_gets_two_groups_and_the_pair_all_of_its_memory(
    tmp_path: Path,
) -> None:
    """On two GPU groups each one-server deployment runs twice behind least-load placement,
    the pair's servers each have a group, with all of its memory, and specroute also routes
    over two adaptive servers with the written schedule."""
    shared = setup(FLAGS, 1024, 128, tmp_path)
    built = setup(FLAGS, 1024, 128, tmp_path, "partitioned")
    by_name = {c.name: c for c in built.contenders}
    assert all(len(c.servers) == 2 for c in built.contenders)
    assert built.memory["specroute"] == [built.memory["eagle"][0], built.memory["plain"][0]]
    assert built.capacity_tps == pytest.approx(2 * shared.capacity_tps)
    over_adaptive = by_name["specroute-adaptive"]
    assert [s.config for s in over_adaptive.servers] == [
        by_name["adaptive-calibrated"].servers[0].config
    ] * 2
    assert [s.pool for s in over_adaptive.servers] == ["spec", "base"]
    window = azure_conversations().window(600, 10).scaled(2)
    spread = serve(by_name["plain"], window, 60.0)
    assert {r.served_by for r in spread} == {"base:0", "base:1"}


# every model once and every traffic at least once (the committed runs cross them all)
MATRIX = [
    ("llama3.1-8b-h100", "ramp"),
    ("llama3.1-8b-h200", "day"),
    ("qwen3-30b-a3b-h200", "azure"),
    ("kimi-k2.5-8x-pcie", "day"),
]


@pytest.mark.parametrize(("model", "traffic"), MATRIX)
def test_the_matrix_offline(model: str, traffic: str) -> None:
    """Every model in its topology (and Llama-3.1-8B on an H100 partitioned too) under one
    traffic each, at one utilisation on a short window: every contender and the oracle are
    sent the same requests, and the oracle's minutes are the plain and EAGLE-3 runs'."""
    flags, topology = MODELS[model]
    window = azure_conversations().window(600, 20)
    trace = window if traffic == "azure" else shaped(traffic, window)
    topologies = ["shared", "partitioned"] if model == "llama3.1-8b-h100" else [topology]
    for where in topologies:
        document = head_to_head(flags, trace, [0.75], SLO, topology=where)  # type: ignore[arg-type]
        row = document["utilisations"]["0.75"]
        names = [*document["contenders"], ORACLE]
        # every request sent, answered or still running when the replay ends (a slower
        # deployment may leave some of a short window unfinished)
        sent = {n: row[n]["requests"] + row[n]["unfinished"] for n in names}
        assert len(set(sent.values())) == 1 and row[ORACLE]["failed"] == 0, sent
        assert row[ORACLE]["minutes"]["plain"] + row[ORACLE]["minutes"]["eagle"] >= 1
        assert document["trace"]["peak_rate"] >= document["trace"]["rate"]
        pair = [] if document["unfit"] else ["specroute"]
        extra = {"shared": [], "partitioned": ["specroute-adaptive"]}[where]
        assert document["contenders"][4:] == [*pair, *extra]
        # Qwen3-30B-A3B's weights twice and two of SGLang's reserves overfill one H200
        assert bool(document["unfit"]) == (model == "qwen3-30b-a3b-h200")


def test_the_command_prints_its_table_and_keeps_its_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "deployments.json"
    argv = ["bench", "deployments", *FLAGS, "--window", "600+20", "--utilisation", "0.5"]
    assert main([*argv, "--traffic", "day", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    document = json.loads(out.read_text())
    assert render(document) in printed
    assert document["trace"]["name"] == "azure-llm-2023-conv-day"
    assert document["contenders"] == [
        "plain",
        "eagle",
        "adaptive",
        "adaptive-calibrated",
        "specroute",
    ]
    assert main(["bench", "deployments", *FLAGS, "--window", "99999+10"]) == 2
    assert main([*argv, "--live", "0.9"]) == 2
    assert "--live [0.9]: not among --utilisation" in capsys.readouterr().err
