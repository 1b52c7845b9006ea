"""``specroute demo``: two emulated SGLang servers, one with EAGLE-3, side by side."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import aiohttp
import openai
from aiohttp import web

from emulator.config import EmulatorConfig
from emulator.predict import predict, render
from emulator.server import create_app

PROMPT = "Explain in a few sentences why speculative decoding helps at low load."


async def _serve(config: EmulatorConfig) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(create_app(config), handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


async def _stream(name: str, url: str, max_tokens: int, time_scale: float) -> None:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    stream = await client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    print(f"\n[{name}] {url}/v1/chat/completions, streaming:")
    start = time.perf_counter()
    first = last = 0.0
    chunks = tokens = 0
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            last = time.perf_counter()
            first = first or last
            chunks += 1
            print(chunk.choices[0].delta.content, end="", flush=True)
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    async with aiohttp.ClientSession() as session, session.get(f"{url}/server_info") as r:
        state = (await r.json())["internal_states"][0]
    accept = state.get("avg_spec_accept_length")
    decode = (tokens - 1) / (last - first) * time_scale if last > first else float("nan")
    print(
        f"\n[{name}] {tokens} tokens in {chunks} chunks, first after "
        f"{(first - start) * 1000 / time_scale:.0f} ms, decode {decode:.1f} tok/s"
        + (f", accept length {accept:.2f}" if accept else "")
    )


async def run_demo(config: EmulatorConfig, max_tokens: int = 96) -> None:
    servers = [await _serve(replace(config, mode=mode)) for mode in ("spec", "base")]
    try:
        print(f"Two emulated SGLang servers of {config.hardware.name}: "
              f"spec at {servers[0][1]}, base at {servers[1][1]}")  # fmt: skip
        for (_, url), name in zip(servers, ("spec", "base"), strict=True):
            await _stream(name, url, max_tokens, config.time_scale)
    finally:
        for runner, _ in servers:
            await runner.cleanup()
    levels = [1, 2, 4, 8, 16, 32, 64]
    print()
    print(
        render(predict(config, levels), f"{config.hardware.name}: where speculation stops paying")
    )


def demo(config: EmulatorConfig) -> None:
    asyncio.run(run_demo(config))
