"""One streamed chat request, timed chunk by chunk.

Asks for usage on every chunk (``stream_options.continuous_usage_stats``, which SGLang and
vLLM honour) so a speculative chunk's several tokens are counted as several; a server that
ignores it is counted one token per content chunk, corrected by the final usage.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import time
from collections.abc import Iterator
from typing import Any

import aiohttp

from specroute.loadgen.dataset import Dataset, Prompt, synthetic
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.trace import Trace


def request_body(prompt: Prompt, model: str, ignore_eos: bool) -> dict[str, Any]:
    body = prompt.body() | {
        "model": model,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        "temperature": 0.0,
    }
    if ignore_eos:
        body["ignore_eos"] = True  # SGLang's and vLLM's extra field: fixed output lengths
    return body


def request_bodies(dataset: Dataset, model: str, ignore_eos: bool) -> Iterator[dict[str, Any]]:
    """The dataset's prompts as request bodies, round and round."""
    return (request_body(p, model, ignore_eos) for p in itertools.cycle(dataset.prompts))


class PhaseBodies:
    """The request bodies of a trace, by phase: a phase that names prompt lengths sends
    synthetic prompts of them (``output_len`` tokens each; with several lengths, one drawn
    per request from ``seed``, so a live and an offline run draw the same sequence), any
    other the run's dataset. Each source goes round and round on its own."""

    def __init__(
        self,
        trace: Trace,
        dataset: Dataset,
        model: str,
        ignore_eos: bool,
        output_len: int,
        seed: int = 0,
    ) -> None:
        self.trace = trace
        self.dataset = request_bodies(dataset, model, ignore_eos)
        self.by_length = {
            n: request_bodies(synthetic(n, output_len, seed=seed), model, ignore_eos)
            for n in trace.input_lens
        }
        self.rng = random.Random(f"input-len|{seed}")

    def __call__(self, phase: int) -> dict[str, Any]:
        lengths = self.trace.phases[phase].input_len
        if not lengths:
            return next(self.dataset)
        length = lengths[0] if len(lengths) == 1 else self.rng.choice(lengths)
        return next(self.by_length[length])


async def served_model(session: aiohttp.ClientSession, url: str) -> str:
    """The model a server (or the router) names first in ``/v1/models``; "default" when it
    names none."""
    try:
        async with session.get(f"{url}/v1/models") as r:
            data = (await r.json()).get("data") or [{}]
            return str(data[0].get("id", "default"))
    except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
        return "default"


async def send(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    record: RequestRecord,
    headers: dict[str, str] | None = None,
    first_token: asyncio.Event | None = None,
) -> RequestRecord:
    """Fill ``record`` from one request; errors are recorded, never raised. ``first_token``
    is set when the first token arrives (or the request fails)."""
    counted = 0
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body, headers=headers) as r:
            record.served_by = r.headers.get("x-specroute-backend")
            if r.status != 200:
                record.error = f"HTTP {r.status}: {(await r.text())[:300]}"
                return record
            async for line in r.content:
                if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                    continue
                now = time.monotonic()
                event = json.loads(line[6:])
                if "error" in event:
                    record.error = f"stream error: {event['error'].get('message', event)}"
                    return record
                usage = event.get("usage")
                has_text = any(
                    (c.get("delta") or {}).get("content") or c.get("text")
                    for c in event.get("choices") or []
                )
                if usage:
                    record.output_tokens = usage.get("completion_tokens")
                    record.prompt_tokens = usage.get("prompt_tokens")
                total = record.output_tokens if usage and event.get("choices") else None
                new = (total - counted) if total is not None else int(has_text)
                if new > 0 and (has_text or total is not None):
                    if record.first_token is None:
                        record.first_token = now
                        if first_token is not None:
                            first_token.set()
                    record.chunks.append((now, new))
                    counted += new
        record.end = time.monotonic()
        if record.first_token is None:
            record.error = "the stream ended without a token"
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        record.error = f"{type(exc).__name__}: {exc}"
    finally:
        if first_token is not None:
            first_token.set()
    return record
