"""The emulator's OpenAI-compatible traffic, checked against SGLang 0.5.23's own models.

Responses (plain and streamed, chat and completions), an error body and the request
bodies are captured from an in-process emulator, then validated by
``tests/conformance/validate.py`` running in ``.venv-sglang``, which holds the real
``sglang`` package (``make conformance-env`` builds it).
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from tests.emulators import running_emulator

REPO = Path(__file__).resolve().parents[2]
SGLANG_PYTHON = REPO / ".venv-sglang" / "bin" / "python"
VALIDATOR = REPO / "tests" / "conformance" / "validate.py"

CHAT: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Tell me about speculative decoding."},
]
PROMPT = "Speculative decoding drafts tokens and"

Capture = list[dict[str, Any]]

pytestmark = pytest.mark.skipif(
    not SGLANG_PYTHON.exists(),
    reason=f"{SGLANG_PYTHON} is missing: run `make conformance-env` to build it",
)


@pytest.fixture
async def spec_url() -> AsyncIterator[str]:
    async with running_emulator("--mode", "spec", "--time-scale", "0.05") as url:
        yield url


def _sent(kind: str, content: bytes) -> dict[str, Any]:
    """A request body exactly as the official client put it on the wire."""
    return {"kind": kind, "body": json.loads(content)}


async def _sse_chunks(session: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Capture:
    """POST a streaming request; every ``data:`` line's JSON, up to ``[DONE]``."""
    chunks: list[dict[str, Any]] = []
    async with session.post(url, json=body) as response:
        assert response.status == 200, await response.text()
        assert response.content_type == "text/event-stream"
        done = False
        async for raw in response.content:
            line = raw.decode().strip()
            if not line:
                continue
            assert line.startswith("data: "), f"not an SSE data line: {line!r}"
            payload = line.removeprefix("data: ")
            assert not done, f"data after [DONE]: {payload!r}"
            if payload == "[DONE]":
                done = True
                continue
            chunks.append(json.loads(payload))
        assert done, "the stream ended without data: [DONE]"
    return chunks


async def _capture(url: str) -> Capture:
    capture: Capture = []
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    async with client:
        raw_chat = await client.chat.completions.with_raw_response.create(
            model="default", messages=CHAT, max_tokens=12, temperature=0
        )
        raw_chat.parse()  # the official client accepts it too
        capture.append(_sent("chat_request", raw_chat.http_response.request.content))
        capture.append({"kind": "chat", "body": json.loads(raw_chat.http_response.content)})

        raw_completion = await client.completions.with_raw_response.create(
            model="default", prompt=PROMPT, max_tokens=12, temperature=0
        )
        raw_completion.parse()
        capture.append(_sent("completion_request", raw_completion.http_response.request.content))
        capture.append(
            {"kind": "completion", "body": json.loads(raw_completion.http_response.content)}
        )

        with pytest.raises(openai.BadRequestError) as refused:
            await client.chat.completions.create(model="default", messages=[], max_tokens=4)
        assert refused.value.status_code == 400
        capture.append({"kind": "error", "body": refused.value.response.json()})

        served = (await client.models.list()).data[0].id
        for limit in (64, 6):
            raw_response = await client.responses.with_raw_response.create(
                model=served, input=PROMPT, instructions="Be brief.", max_output_tokens=limit
            )
            raw_response.parse()
            capture.append(_sent("responses_request", raw_response.http_response.request.content))
            capture.append(
                {"kind": "response", "body": json.loads(raw_response.http_response.content)}
            )
        with pytest.raises(openai.NotFoundError) as unknown:
            await client.responses.create(model="no-such-model", input=PROMPT)
        capture.append({"kind": "response_error", "body": unknown.value.response.json()})

    chat_body: dict[str, Any] = {
        "model": "default",
        "messages": CHAT,
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    completion_body: dict[str, Any] = {
        "model": "default",
        "prompt": PROMPT,
        "max_tokens": 12,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with aiohttp.ClientSession() as session:
        chat_chunks = await _sse_chunks(session, f"{url}/v1/chat/completions", chat_body)
        completion_chunks = await _sse_chunks(session, f"{url}/v1/completions", completion_body)
    capture.append({"kind": "chat_request", "body": chat_body})
    capture.append({"kind": "completion_request", "body": completion_body})
    capture += [{"kind": "chat_chunk", "body": chunk} for chunk in chat_chunks]
    capture += [{"kind": "completion_chunk", "body": chunk} for chunk in completion_chunks]

    # What must be there for the validator's verdict to mean something.
    assert len(chat_chunks) >= 4, chat_chunks  # role, content..., finish, usage
    assert chat_chunks[-1]["choices"] == [] and chat_chunks[-1]["usage"], chat_chunks[-1]
    assert completion_chunks[-1]["choices"] == [], completion_chunks[-1]
    kinds = {item["kind"] for item in capture}
    assert kinds == {
        "chat",
        "chat_chunk",
        "completion",
        "completion_chunk",
        "chat_request",
        "completion_request",
        "error",
        "response",
        "responses_request",
        "response_error",
    }, kinds
    statuses = [item["body"]["status"] for item in capture if item["kind"] == "response"]
    assert "incomplete" in statuses, statuses  # cut short at max_output_tokens, as SGLang says
    return capture


async def test_responses_validate_against_sglang_protocol(spec_url: str, tmp_path: Path) -> None:
    capture = await _capture(spec_url)
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(capture, indent=1))

    process = await asyncio.create_subprocess_exec(
        str(SGLANG_PYTHON),
        str(VALIDATOR),
        str(path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        cwd=REPO,
    )
    output, _ = await asyncio.wait_for(process.communicate(), timeout=120)
    report = output.decode(errors="replace")
    sys.stdout.write(report)
    assert process.returncode == 0, f"validate.py exited {process.returncode}:\n{report}"
    assert f"conformance: {len(capture)} passed, 0 failed" in report, report
