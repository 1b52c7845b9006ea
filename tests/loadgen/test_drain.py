"""Waiting for servers to let go of cancelled requests (``loadgen.drain``), against an
emulator: busy while a stream runs there, idle soon after its client goes."""

from __future__ import annotations

import time

import aiohttp

from specroute.loadgen.drain import busy, drained

BODY = {
    "model": "m",
    "messages": [{"role": "user", "content": "tell a long story"}],
    "max_tokens": 4000,
    "ignore_eos": True,
    "stream": True,
}


async def test_a_cancelled_stream_leaves_and_the_wait_ends_then(
    backends: tuple[str, str],
) -> None:
    spec, base = backends
    async with aiohttp.ClientSession() as session:
        assert await drained(session, [spec, base], 1.0) is True  # nothing sent yet
        stream = await session.post(f"{spec}/v1/chat/completions", json=BODY)
        await stream.content.readline()  # under way
        assert await busy(session, spec) == 1 and await busy(session, base) == 0
        assert await drained(session, [spec, base], 0.3) is False  # 4,000 tokens take longer
        stream.close()  # the client goes, as a trace's end cancels what is in flight
        started = time.monotonic()
        assert await drained(session, [spec, base], 30.0) is True
        assert time.monotonic() - started < 5.0  # at the server's next step, not a pause


async def test_a_server_without_loads_cannot_say(backends: tuple[str, str]) -> None:
    """As vLLM, which has no ``/v1/loads``: a 404 is neither busy nor idle."""
    spec, _ = backends
    async with aiohttp.ClientSession() as session:
        assert await busy(session, f"{spec}/elsewhere") is None
        assert await drained(session, [spec, f"{spec}/elsewhere"], 1.0) is None
