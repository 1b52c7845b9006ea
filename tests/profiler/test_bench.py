"""``specroute bench sweep`` and ``specroute profile`` against emulators: what the sweep
keeps, the warnings it gives, failed levels, datasets and the metric definitions."""

from __future__ import annotations

import asyncio
import json
import sys
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import Any

import pytest

from specroute.loadgen.dataset import DatasetError, jsonl, sharegpt, synthetic
from specroute.loadgen.record import RequestRecord
from specroute.policies.profile import load_profile
from tests.processes import emulator_pair, specroute

FAST = ("--time-scale", "0.05")
# a sweep refuses a server that falls behind its time scale: one that keeps it here (at
# 0.25 a step of a few milliseconds lost 5-6% to timer slack at one or two requests)
KEPT = ("--time-scale", "0.5")
H100 = ("--hardware", "llama3.1-8b-h100")  # speculation wins clearly at low load


async def run(*args: str) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specroute", *args, stdout=PIPE, stderr=PIPE
    )
    out, err = await process.communicate()
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_metric_definitions() -> None:
    record = RequestRecord(
        "spec",
        1,
        0,
        start=10.0,
        first_token=10.5,
        end=12.5,
        chunks=[(10.5, 1), (11.5, 4), (12.5, 5)],
        output_tokens=10,
    )
    assert record.ttft() == 0.5
    assert record.tpot() == pytest.approx(2.0 / 9)
    assert record.decode_tps() == pytest.approx(4.5)
    assert record.e2e() == 2.5
    assert record.itl() == [0.25] * 4 + [0.2] * 5  # a chunk of k tokens is k gaps
    assert RequestRecord.from_json(json.loads(json.dumps(record.as_json()))) == record
    assert RequestRecord("base", 1, 0, 0.0, error="HTTP 503").tpot() is None


def test_datasets(tmp_path: Path) -> None:
    prompts = synthetic(512, 64, count=4).prompts
    assert len(prompts) == 4 and all(p.max_tokens == 64 for p in prompts)
    assert synthetic(512, 64).fingerprint() == synthetic(512, 64).fingerprint()
    assert synthetic(512, 64).fingerprint() != synthetic(512, 64, seed=1).fingerprint()
    share = tmp_path / "share.json"
    share.write_text(
        json.dumps(
            [
                {
                    "conversations": [
                        {"from": "human", "value": "hi there"},
                        {"from": "gpt", "value": "one two three four five"},
                    ]
                },
                {"conversations": [{"from": "gpt", "value": "skipped: no human turn first"}]},
            ]
        )
    )
    loaded = sharegpt(share, None)
    assert [(p.messages[0]["content"], p.max_tokens) for p in loaded.prompts] == [("hi there", 5)]
    own = tmp_path / "own.jsonl"
    own.write_text(
        '{"prompt": "def f():"}\n\n{"messages": [{"role": "user", "content": "x"}],'
        ' "max_tokens": 7}\n'
    )
    assert [p.max_tokens for p in jsonl(own, 32).prompts] == [32, 7]
    own.write_text('{"text": "no"}\n')
    with pytest.raises(DatasetError, match=r"own.jsonl:1: needs 'prompt'"):
        jsonl(own, 32)
    with pytest.raises(DatasetError, match="cannot read"):
        jsonl(tmp_path / "missing.jsonl", 32)


async def test_sweep_keeps_everything_and_warns_when_unfair(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    # SGLang's default: a speculative server runs at most 48 requests, the plain one more
    async with emulator_pair(*KEPT, *H100) as (spec, base):
        code, stdout, stderr = await run(
            "bench",
            "sweep",
            "--spec",
            spec,
            "--base",
            base,
            "--concurrency",
            "1,2",
            "--input-len",
            "64",
            "--output-len",
            "16",
            "--repeats",
            "2",
            "--requests-per-level",
            "4",
            "--slo",
            "ttft=1,tpot=50ms",
            "--out",
            str(out),
        )
    assert code == 0, stderr
    assert "UNFAIR COMPARISON" in stderr and "max_running_requests differs" in stderr
    assert "[  8/8] level    2" in stderr  # progress: one line per level, backend and repeat
    meta = json.loads((out / "meta.json").read_text())
    assert meta["spec"]["server_info"]["max_running_requests"] == 48
    assert meta["base"]["server_info"]["speculative_algorithm"] is None
    assert meta["fairness_warnings"] and meta["complete"] and meta["settings"]["slo"]
    runs = lines(out / "levels.jsonl")
    assert [(r["level"], r["backend"]) for r in runs[:4]] == [
        (1, "spec"),
        (1, "base"),
        (1, "base"),
        (1, "spec"),
    ]  # interleaved
    assert all(r["valid"] and r["measured"] == 4 for r in runs)
    assert all(r["accept_length"] > 1.5 for r in runs if r["backend"] == "spec")
    assert all(r["accept_length"] is None for r in runs if r["backend"] == "base")
    requests = lines(out / "requests.jsonl")
    measured = [r for r in requests if r["measured"]]
    assert len(measured) == 16 * 2
    assert all(r["output_tokens"] == 16 and sum(n for _, n in r["chunks"]) == 16 for r in measured)
    spec_chunks = [len(r["chunks"]) for r in measured if r["backend"] == "spec"]
    assert max(spec_chunks) < 16  # a speculative chunk carries several tokens

    code, stdout, stderr = await run(
        "profile", str(out), "-o", str(tmp_path / "p.json"), "--report", str(tmp_path / "r.md")
    )
    assert code == 0, stderr
    profile = json.loads((tmp_path / "p.json").read_text())
    assert profile["crossover"]["value"] is None and profile["crossover"]["bound"] == "above"
    assert profile["crossover"]["limit"] == 2
    assert "speculation pays at every level" in stdout
    row = profile["levels"][0]["spec"]
    assert row["slo_met"] is not None and row["goodput_rps"] > 0
    assert row["tpot_ms"]["ci"][0] <= row["tpot_ms"]["median"] <= row["tpot_ms"]["ci"][1]
    assert profile["servers"]["spec"]["max_running_requests"] == 48
    report = (tmp_path / "r.md").read_text()
    assert "every level measured" in report and "max_running_requests differs" in report
    bounded = load_profile(tmp_path / "p.json").crossover
    assert bounded.threshold == 2 and bounded.note is not None  # no guess past what was measured


async def test_a_level_with_failures_is_invalid(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    async with (
        specroute(
            "emulate",
            "--mode",
            "spec",
            *KEPT,
            "--max-queued-requests",
            "1",
            "--max-running-requests",
            "1",
        ) as (spec, _),
        specroute("emulate", "--mode", "base", *KEPT, "--max-running-requests", "1") as (base, _),
    ):
        code, _, stderr = await run(
            "bench",
            "sweep",
            "--spec",
            spec,
            "--base",
            base,
            "--concurrency",
            "4",
            "--output-len",
            "8",
            "--repeats",
            "1",
            "--requests-per-level",
            "4",
            "--out",
            str(out),
        )
    assert code == 0, stderr
    runs = {r["backend"]: r for r in lines(out / "levels.jsonl")}
    assert runs["spec"]["failures"] > 0 and not runs["spec"]["valid"]
    assert "INVALID" in stderr
    errors = [r["error"] for r in lines(out / "requests.jsonl") if r["backend"] == "spec"]
    assert any(e and "queue is full" in e for e in errors)  # SGLang says it mid-stream
    code, _, stderr = await run("profile", str(out), "-o", str(tmp_path / "p.json"))
    assert code == 2 and "no level has valid measurements" in stderr


async def test_bad_flags_are_refused(tmp_path: Path) -> None:
    code, _, stderr = await run("profile", str(tmp_path), "-o", str(tmp_path / "p.json"))
    assert code == 2 and "not a sweep folder" in stderr
    code, _, stderr = await run(
        "bench",
        "sweep",
        "--spec",
        "http://127.0.0.1:9",
        "--base",
        "http://127.0.0.1:9",
        "--slo",
        "ttfx=1",
        "--out",
        "x",
    )
    assert code == 2 and "SLO keys are ttft, tpot" in stderr


async def test_duration_mode_measures_what_starts_in_the_window(tmp_path: Path) -> None:
    out = tmp_path / "sweep"
    async with emulator_pair(*KEPT, *H100) as (spec, base):
        code, _, stderr = await run(
            "bench",
            "sweep",
            "--spec",
            spec,
            "--base",
            base,
            "--concurrency",
            "2",
            "--output-len",
            "16",
            "--repeats",
            "1",
            "--duration-per-level",
            "0.3",
            "--out",
            str(out),
        )
    assert code == 0, stderr
    runs = lines(out / "levels.jsonl")
    requests = lines(out / "requests.jsonl")
    for run_ in runs:
        measured = [r for r in requests if r["backend"] == run_["backend"] and r["measured"]]
        assert run_["valid"] and len(measured) == run_["measured"] > 2
        assert all(run_["t0"] <= r["start"] < run_["t0"] + 0.3 for r in measured)
        assert max(r["end"] for r in measured) == pytest.approx(run_["t1"], abs=0.05)
