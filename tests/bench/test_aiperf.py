"""AIPerf, a benchmark client a team already runs against SGLang, through the router in
front of two emulated servers: a short streamed run with a tokenizer made here, and what
the router counted and logged matches what AIPerf recorded, request by request."""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import pytest

from tests.emulator.test_emulator_api import metric
from tests.emulators import running_emulator
from tests.routers import running_router

REPO = Path(__file__).resolve().parents[2]
AIPERF = REPO / ".venv-aiperf" / "bin"
REQUESTS, CONCURRENCY = 24, 4
MODEL = "moonshotai/Kimi-K2.5"  # the emulators' default hardware model serves this name

pytestmark = pytest.mark.skipif(
    not (AIPERF / "aiperf").exists(),
    reason=f"{AIPERF / 'aiperf'} is missing: run `make aiperf-env` to build it",
)

# A byte-level BPE tokenizer trained on a few of Python's own sources: nothing downloaded.
TOKENIZER = """
import sys, sysconfig
from pathlib import Path
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

sources = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:30]
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(
    vocab_size=2000,
    special_tokens=["<s>", "</s>", "<unk>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
)
tok.train_from_iterator([f.read_text(errors="replace") for f in sources], trainer)
fast = PreTrainedTokenizerFast(
    tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
)
fast.save_pretrained(sys.argv[1])
"""


async def _run(*command: str | Path, cwd: Path) -> str:
    """A command in its own process, while this loop serves the router; its output."""
    env = {**os.environ, "NO_COLOR": "1"}  # the tokenizer is a local folder: no hub is asked
    process = await asyncio.create_subprocess_exec(
        *map(str, command),
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), 240)
    said = out.decode(errors="replace")
    assert process.returncode == 0, said[-3000:]
    return said


async def test_aiperf_through_the_router_counts_what_the_router_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="specroute.router.access")
    tokenizer = tmp_path / "tokenizer"
    await _run(AIPERF / "python", "-c", TOKENIZER, tokenizer, cwd=tmp_path)
    artifacts = tmp_path / "artifacts"
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.01") as spec,
        running_emulator("--mode", "base", "--time-scale", "0.01") as base,
        running_router(spec=[spec], base=[base], crossover=2) as (url, _),
    ):
        await _run(
            AIPERF / "aiperf",
            "profile",
            "--model",
            MODEL,
            "--url",
            url,
            "--endpoint-type",
            "chat",
            "--streaming",
            "--tokenizer",
            tokenizer,
            "--request-count",
            str(REQUESTS),
            "--concurrency",
            str(CONCURRENCY),
            "--synthetic-input-tokens-mean",
            "32",
            "--output-tokens-mean",
            "16",
            "--extra-inputs",
            "ignore_eos:true",
            "--random-seed",
            "1",
            "--ui-type",
            "none",
            "--record-processors",
            "1",
            "--artifact-dir",
            artifacts,
            cwd=tmp_path,
        )
        answered = await metric(url, "specroute_requests_total")
        decided = await metric(url, "specroute_route_decisions_total")
    summary = json.loads((artifacts / "profile_export_aiperf.json").read_text())
    records = [json.loads(line) for line in (artifacts / "profile_export.jsonl").open()]
    assert summary["request_count"]["avg"] == REQUESTS and not summary["error_summary"]
    assert answered == decided == REQUESTS  # every request the tool made, routed and answered
    lines: dict[str, dict[str, Any]] = {
        r.__dict__["fields"]["request_id"]: r.__dict__["fields"]
        for r in caplog.records
        if r.name == "specroute.router.access"
        and r.__dict__["fields"]["path"] == "/v1/chat/completions"
    }
    # the tool's own id of each request is the id the router logged it under
    ids = {record["metadata"]["x_request_id"]: record["metrics"] for record in records}
    assert set(ids) == set(lines)
    for rid, metrics in ids.items():
        line = lines[rid]
        assert line["status"] == 200 and line["outcome"] == "answered", line
        assert line["completion_tokens"] == metrics["usage_completion_tokens"]["value"], rid
        assert line["prompt_tokens"] == metrics["usage_prompt_tokens"]["value"], rid
    pools = {line["pool"] for line in lines.values()}
    print(f"AIPerf: {REQUESTS} requests at concurrency {CONCURRENCY}; pools {sorted(pools)}")
