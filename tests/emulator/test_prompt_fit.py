"""Synthetic prompts of the length asked for in the server's own tokens: two probes count
what the server's tokenizer makes of the synthetic words, and the word count is solved."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from specroute.loadgen.dataset import synthetic
from specroute.loadgen.prompt_fit import fitted
from tests.apps import serving
from tests.emulators import running_emulator


def _counting(per_word: float | None, template: int) -> web.Application:
    """A server whose tokenizer counts ``per_word`` tokens a word and ``template`` for the
    chat around it; None: it answers without usage."""

    async def chat(request: web.Request) -> web.Response:
        body = await request.json()
        words = len(body["messages"][0]["content"].split())
        answer: dict[str, object] = {"object": "chat.completion", "choices": []}
        if per_word is not None:
            answer["usage"] = {"prompt_tokens": template + math.ceil(per_word * words)}
        return web.json_response(answer)

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as s:
        yield s


async def test_prompts_are_refitted_to_a_tokenizer_that_counts_otherwise(
    session: aiohttp.ClientSession,
) -> None:
    notes: list[str] = []
    asked = synthetic(128, 64)
    async with serving(_counting(1.5, 20)) as url:
        fit = await fitted(session, url, "m", asked, notes.append)
    words = {len(str(p.messages[0]["content"]).split()) for p in fit.prompts}
    assert words == {72}  # 20 + 1.5 x 72 = 128
    assert len(fit.prompts) == len(asked.prompts) and fit.source.endswith(":words=72")
    assert notes == [
        "the server counts 1.50 tokens a synthetic word and 20 for the chat template: "
        "prompts of 128 tokens are 72 words"
    ]


async def test_the_emulators_count_needs_no_fit(session: aiohttp.ClientSession) -> None:
    notes: list[str] = []
    asked = synthetic(128, 64)
    async with running_emulator("--mode", "spec", "--time-scale", "0.05") as url:
        assert await fitted(session, url, "m", asked, notes.append) is asked
    assert notes == []


async def test_a_server_that_does_not_count_is_said_and_left_alone(
    session: aiohttp.ClientSession,
) -> None:
    notes: list[str] = []
    asked = synthetic(128, 64)
    async with serving(_counting(None, 0)) as url:
        assert await fitted(session, url, "m", asked, notes.append) is asked
    assert len(notes) == 1 and "could not count prompt tokens" in notes[0]
