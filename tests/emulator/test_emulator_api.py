"""The emulator's HTTP surface, driven as SGLang's clients drive it."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from specroute.emulator.engine import Emission, Sequence
from specroute.emulator.server import LOOP, create_app
from tests.apps import serving
from tests.emulators import emulator_config, running_emulator

FAST = ("--time-scale", "0.05")


@pytest.fixture
async def spec_url() -> AsyncIterator[str]:
    async with running_emulator("--mode", "spec", *FAST) as url:
        yield url


@pytest.fixture
async def base_url() -> AsyncIterator[str]:
    async with running_emulator("--mode", "base", *FAST) as url:
        yield url


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def sse_events(response: aiohttp.ClientResponse) -> list[str]:
    events = []
    async for line in response.content:
        text = line.decode().strip()
        if text.startswith("data: "):
            events.append(text.removeprefix("data: "))
    return events


async def metric(url: str, name: str) -> float:
    """The sum of a metric's samples across label sets."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


CHAT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Tell me about speculative decoding."}
]


async def test_chat_stream_chunk_order_and_usage(spec_url: str) -> None:
    body = {
        "model": "m",
        "messages": CHAT,
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with (
        aiohttp.ClientSession() as s,
        s.post(f"{spec_url}/v1/chat/completions", json=body) as r,
    ):
        assert r.status == 200
        assert r.content_type == "text/event-stream"
        events = await sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    role, *content, finish, usage = chunks
    assert role["choices"][0]["delta"] == {
        "reasoning_content": None,
        "role": "assistant",
        "content": "",
    }
    assert content and all(c["choices"][0]["finish_reason"] is None for c in content)
    assert all("content" in c["choices"][0]["delta"] for c in content)
    assert finish["choices"][0]["delta"] == {"reasoning_content": None}
    assert finish["choices"][0]["finish_reason"] == "length"
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 12
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 12
    assert len({c["id"] for c in chunks}) == 1
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "m" for c in chunks)
    # a speculative server sends several tokens per chunk: fewer content chunks than tokens
    assert len(content) < 12


async def test_chat_stream_without_usage_option(base_url: str) -> None:
    stream = await client(base_url).chat.completions.create(
        model="m",
        messages=CHAT,
        max_tokens=5,
        stream=True,
    )
    chunks = [chunk async for chunk in stream]
    assert all(chunk.usage is None for chunk in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 5  # the base server: one word per token


async def test_chat_non_stream_matches_stream_and_modes_agree(spec_url: str, base_url: str) -> None:
    """Lossless speculation: both modes give the same text for the same prompt and seed."""
    texts = []
    for url in (spec_url, base_url):
        response = await client(url).chat.completions.create(
            model="m",
            messages=CHAT,
            max_tokens=20,
        )
        assert response.choices[0].finish_reason == "length"
        assert response.usage is not None and response.usage.completion_tokens == 20
        texts.append(response.choices[0].message.content)
    stream = await client(spec_url).chat.completions.create(
        model="m",
        messages=CHAT,
        max_tokens=20,
        stream=True,
    )
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert texts[0] == texts[1] == streamed


async def test_completions_stream_and_stop(base_url: str) -> None:
    c = client(base_url)
    full = await c.completions.create(model="m", prompt="Once upon a time", max_tokens=30)
    words = full.choices[0].text.split()
    stop = " " + words[5]
    stopped = await c.completions.create(
        model="m", prompt="Once upon a time", max_tokens=30, stop=[stop]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert stop not in stopped.choices[0].text
    assert full.choices[0].text.startswith(stopped.choices[0].text)
    stream = await c.completions.create(
        model="m",
        prompt="Once upon a time",
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 30
    assert chunks[-2].choices[0].finish_reason == "length"
    assert "".join(ch.choices[0].text for ch in chunks[:-1]) == full.choices[0].text


async def test_ignore_eos_and_natural_stop(base_url: str) -> None:
    c = client(base_url)
    natural = await c.completions.create(model="m", prompt="x", max_tokens=4000)
    assert natural.choices[0].finish_reason == "stop"
    assert natural.usage is not None and natural.usage.completion_tokens < 4000
    forced = await c.completions.create(
        model="m",
        prompt="x",
        max_tokens=natural.usage.completion_tokens + 5,
        extra_body={"ignore_eos": True},
    )
    assert forced.choices[0].finish_reason == "length"


JSON = "application/json"
HI = b'{"messages": [{"role": "user", "content": "hi"}]}'


@pytest.mark.parametrize(
    ("body", "content_type", "fragment"),
    [
        (b"{not json", JSON, "JSON decode error"),
        (b'{"messages": []}', JSON, "Messages cannot be empty"),
        (b'{"model": "m"}', JSON, "messages"),
        (HI[:-1] + b', "n": 2}', JSON, "n=1"),
        (HI[:-1] + b', "max_tokens": -1}', JSON, "max_tokens"),
        (HI[:-1] + b', "max_tokens": 999999}', JSON, "context length"),
        (HI, "text/plain", "application/json"),
        (b'{"messages": [{"role": "user", "content": "\\ud800"}]}', JSON, "not valid Unicode"),
        (HI[:-1] + b', "stream": true, "return_meta_info": true}', JSON, "stream=false"),
    ],
)
async def test_bad_requests_get_sglang_errors(
    base_url: str, body: bytes, content_type: str, fragment: str
) -> None:
    async with (
        aiohttp.ClientSession() as s,
        s.post(
            f"{base_url}/v1/chat/completions", data=body, headers={"Content-Type": content_type}
        ) as r,
    ):
        assert r.status == 400
        error = await r.json()
    assert error["object"] == "error" and error["code"] == 400
    assert fragment in error["message"]


async def test_openai_client_sees_bad_request(base_url: str) -> None:
    with pytest.raises(openai.BadRequestError):
        await client(base_url).chat.completions.create(model="m", messages=[], max_tokens=3)


async def test_models_and_unknown_model(spec_url: str) -> None:
    models = await client(spec_url).models.list()
    assert [m.id for m in models.data] == ["moonshotai/Kimi-K2.5"]
    with pytest.raises(openai.NotFoundError):
        await client(spec_url).models.retrieve("no-such-model")
    async with aiohttp.ClientSession() as s, s.get(f"{spec_url}/no/such/path") as r:
        assert r.status == 404


async def test_queue_full_is_503() -> None:
    async with running_emulator(
        "--mode",
        "base",
        "--time-scale",
        "1",
        "--max-running-requests",
        "1",
        "--max-queued-requests",
        "1",
    ) as url:
        c = client(url)

        async def start(prompt: str, running: int, waiting: int) -> asyncio.Task[Any]:
            task = asyncio.create_task(
                c.completions.create(
                    model="m", prompt=prompt, max_tokens=200, extra_body={"ignore_eos": True}
                )
            )
            for _ in range(250):
                load = (await get_json(f"{url}/v1/loads"))["loads"][0]
                if (load["num_running_reqs"], load["num_waiting_reqs"]) == (running, waiting):
                    break
                await asyncio.sleep(0.02)
            return task

        running = await start("a", 1, 0)
        queued = await start("b", 1, 1)
        with pytest.raises(openai.InternalServerError) as refused:
            await c.completions.create(model="m", prompt="c", max_tokens=5)
        assert refused.value.status_code == 503
        assert "queue is full" in str(refused.value)
        for task in (running, queued):
            task.cancel()
        await asyncio.gather(running, queued, return_exceptions=True)


async def test_generate_streams_cumulative_text_with_spec_meta(spec_url: str) -> None:
    body = {
        "text": "hello world",
        "sampling_params": {"max_new_tokens": 10, "ignore_eos": True},
        "stream": True,
        "rid": "req-1",
    }
    async with aiohttp.ClientSession() as s, s.post(f"{spec_url}/generate", json=body) as r:
        events = await sse_events(r)
    assert events[-1] == "[DONE]"
    outs = [json.loads(e) for e in events[:-1]]
    for before, after in itertools.pairwise(outs):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
    last = outs[-1]["meta_info"]
    assert last["id"] == "req-1"
    assert last["finish_reason"] == {"type": "length", "length": 10}
    assert last["completion_tokens"] == 10 == len(outs[-1]["output_ids"])
    assert last["spec_verify_ct"] >= 1
    assert last["spec_accept_length"] == pytest.approx(10 / last["spec_verify_ct"])
    assert last["e2e_latency"] > 0
    assert "spec_verify_ct" not in outs[0]["meta_info"]


async def test_generate_non_stream_on_base_has_no_spec_fields(base_url: str) -> None:
    body = {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}}
    async with aiohttp.ClientSession() as s, s.post(f"{base_url}/generate", json=body) as r:
        out = await r.json()
    assert out["meta_info"]["prompt_tokens"] == 3
    assert out["meta_info"]["completion_tokens"] == len(out["output_ids"]) <= 4
    assert not any(k.startswith("spec_") for k in out["meta_info"])


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200, url
        return await r.json()


async def test_server_info_and_loads(spec_url: str, base_url: str) -> None:
    spec = await get_json(f"{spec_url}/server_info")
    assert spec == {
        **spec,
        "speculative_algorithm": "EAGLE3",
        "speculative_num_steps": 3,
        "speculative_eagle_topk": 1,
        "speculative_num_draft_tokens": 4,
        "max_running_requests": 48,
    }
    assert spec["cuda_graph_max_bs"] == 48  # SGLang caps the default at max_running_requests
    assert (await get_json(f"{spec_url}/get_server_info"))["version"] == spec["version"]
    base = await get_json(f"{base_url}/server_info")
    assert base["speculative_algorithm"] is None
    assert base["max_running_requests"] is None  # as SGLang's: its scheduler sizes it
    assert base["internal_states"][0]["effective_max_running_requests_per_dp"] == 512
    await client(spec_url).completions.create(
        model="m", prompt="p", max_tokens=40, extra_body={"ignore_eos": True}
    )
    state = (await get_json(f"{spec_url}/server_info"))["internal_states"][0]
    assert 1.0 < state["avg_spec_accept_length"] <= 4.0
    assert "avg_spec_accept_length" not in base["internal_states"][0]
    loads = await get_json(f"{spec_url}/v1/loads")
    assert loads["loads"][0]["num_running_reqs"] == 0
    assert loads["loads"][0]["max_running_requests"] == 48
    for path in ("/health", "/health_generate", "/ready"):
        async with aiohttp.ClientSession() as s, s.get(f"{spec_url}{path}") as r:
            assert r.status == 200, path


async def test_metrics_count_tokens_and_verifies(spec_url: str) -> None:
    await client(spec_url).completions.create(
        model="m", prompt="p", max_tokens=30, extra_body={"ignore_eos": True}
    )
    assert await metric(spec_url, "sglang:generation_tokens_total") == 30
    assert await metric(spec_url, "sglang:num_requests_total") == 1
    verifies = await metric(spec_url, "sglang:spec_verify_calls_total")
    assert 29 / 4 <= verifies <= 29  # 29 tokens after prefill's first, 1 to 4 per verify
    assert await metric(spec_url, "sglang:prompt_tokens_total") > 0
    assert await metric(spec_url, "sglang:time_to_first_token_seconds_count") == 1
    assert await metric(spec_url, "sglang:e2e_request_latency_seconds_count") == 1
    for gauge in ("num_running_reqs", "num_queue_reqs", "gen_throughput", "spec_accept_length"):
        async with aiohttp.ClientSession() as s, s.get(f"{spec_url}/metrics") as r:
            assert f"sglang:{gauge}{{" in await r.text()
    assert await metric(spec_url, "specroute_emulator_step_intended_seconds_total") > 0
    async with aiohttp.ClientSession() as s, s.get(f"{spec_url}/metrics") as r:
        text = await r.text()
    assert "_created" not in text and "sglang:num_requests_total{" in text  # as SGLang


async def test_disconnect_aborts_request(spec_url: str) -> None:
    body = {"messages": CHAT, "max_tokens": 5000, "stream": True, "ignore_eos": True}
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{spec_url}/v1/chat/completions", json=body) as r:
            await r.content.readline()
            await r.content.readline()
        # the client is gone: the request leaves the batch at the next step
        for _ in range(100):
            loads = await get_json(f"{spec_url}/v1/loads")
            if loads["loads"][0]["num_running_reqs"] == 0:
                break
            await asyncio.sleep(0.02)
    assert loads["loads"][0]["num_running_reqs"] == 0
    assert await metric(spec_url, "sglang:num_aborted_requests_total") == 1


async def test_abort_request_by_rid(base_url: str) -> None:
    body = {
        "text": "x",
        "sampling_params": {"max_new_tokens": 5000, "ignore_eos": True},
        "rid": "victim",
    }
    async with aiohttp.ClientSession() as s:
        pending = asyncio.create_task(s.post(f"{base_url}/generate", json=body))
        await asyncio.sleep(0.2)
        async with s.post(f"{base_url}/abort_request", json={"rid": "victim"}) as r:
            assert r.status == 200
        response = await pending
        out = await response.json()
    assert out["meta_info"]["finish_reason"]["type"] == "abort"
    assert out["meta_info"]["completion_tokens"] < 5000


async def test_acceptance_changes_at_run_time(spec_url: str) -> None:
    async def accept_length(prompt: str) -> float:
        body = {"text": prompt, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
        async with aiohttp.ClientSession() as s, s.post(f"{spec_url}/generate", json=body) as r:
            meta = (await r.json())["meta_info"]
        return float(meta["spec_accept_length"])

    assert await accept_length("chat about the weather") == pytest.approx(3.0, abs=0.35)
    # the shipped code rule: code prompts are accepted more often
    assert await accept_length("def main():\n    return 1") == pytest.approx(3.4, abs=0.3)
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{spec_url}/emulator/acceptance", json={"accept_length": 1.5}) as r:
            assert r.status == 200
            assert (await r.json())["accept_length"] == pytest.approx(1.5)
        async with s.post(f"{spec_url}/emulator/acceptance", json={"accept_length": 9}) as r:
            assert r.status == 400
    assert await accept_length("chat about the weather again") == pytest.approx(1.5, abs=0.25)


async def test_stream_interval_and_continuous_usage() -> None:
    body = {
        "messages": CHAT,
        "max_tokens": 30,
        "stream": True,
        "ignore_eos": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    async with (
        running_emulator("--mode", "base", "--time-scale", "0.05", "--stream-interval", "4") as url,
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/chat/completions", json=body) as r,
    ):
        events = [json.loads(e) for e in await sse_events(r) if e != "[DONE]"]
    counts = [e["usage"]["completion_tokens"] for e in events if e["choices"]]
    content = [e for e in events if e["choices"] and e["choices"][0]["delta"].get("content")]
    assert counts[0] == 1 and counts[-1] == 30 and counts == sorted(counts)
    steps = [b - a for a, b in itertools.pairwise(counts) if b != a]
    assert steps and all(step == 4 for step in steps[:-1])  # every 4 tokens; the rest at the end
    assert len(content) < 30 // 4 + 3
    assert events[-1]["usage"]["completion_tokens"] == 30


async def test_a_health_check_that_finds_the_last_step_done_is_answered_at_once() -> None:
    """A health check that comes as another request's last token goes out finds the engine
    not idle yet and waits for progress: the engine then runs out of work, and that answers
    it (healthy), where waiting for a next step that never comes would time the router's
    check out and eject a server that is fine (two routers' first checks at once did)."""
    app = create_app(emulator_config("--mode", "base", *FAST))
    async with serving(app) as url:
        loop = app[LOOP]
        checks: list[asyncio.Task[bool]] = []
        finished = asyncio.Event()

        def listener(emission: Emission) -> None:
            if emission.finish is not None:  # as the step's handlers run, before the next
                checks.append(asyncio.create_task(loop.wait_progress(5.0)))
                finished.set()

        loop.submit(Sequence("last-token", "", 1, 1, ignore_eos=True), listener)
        started = asyncio.get_running_loop().time()
        await finished.wait()
        assert await checks[0]
        assert asyncio.get_running_loop().time() - started < 2.0
        async with aiohttp.ClientSession() as s, s.get(f"{url}/health") as r:
            assert r.status == 200
