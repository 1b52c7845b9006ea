"""Synthetic prompts of the length asked for in the server's own tokens. One word of the
synthetic vocabulary is about one token of the emulator's, but a real tokenizer counts
otherwise (a 128-token prompt was 183 tokens on a small BPE model), so before measuring,
two probes ask the server how many prompt tokens prompts of two word counts are, and the
word count is solved from the line through them (the chat template is its intercept)."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import aiohttp

from specroute.loadgen.dataset import (
    Dataset,
    default_words,
    synthetic,
    synthetic_asked,
    words_text,
)

_PROBES = (32, 96)  # words: far enough apart for the slope, short enough to cost nothing


async def prompt_tokens(
    session: aiohttp.ClientSession, url: str, model: str, text: str
) -> int | None:
    """The prompt tokens the server counts for one user message, or None if it says not."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": text}],
        "max_tokens": 1,
        "temperature": 0.0,
    }
    try:
        async with session.post(f"{url}/v1/chat/completions", json=body) as r:
            answer = await r.json(content_type=None) if r.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    usage = answer.get("usage") if isinstance(answer, dict) else None
    count = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    return count if isinstance(count, int) and not isinstance(count, bool) else None


async def fitted(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    dataset: Dataset,
    note: Callable[[str], None],
) -> Dataset:
    """``dataset`` again, its prompts as long as asked in ``url``'s tokens; as it was where
    it is not synthetic, where the server counts as asked already, or where the server does
    not say (that said in ``note``)."""
    asked = synthetic_asked(dataset)
    if asked is None:
        return dataset
    input_len, output_len, seed = asked
    rng = random.Random(seed)
    (w1, w2) = _PROBES
    t1 = await prompt_tokens(session, url, model, words_text(rng, w1))
    t2 = await prompt_tokens(session, url, model, words_text(rng, w2))
    if t1 is None or t2 is None:
        note(
            "could not count prompt tokens on the server (no usage in its answer): "
            "synthetic prompts are about one token a word"
        )
        return dataset
    slope = (t2 - t1) / (w2 - w1)
    if slope <= 0:
        return dataset
    template = t1 - slope * w1
    words = max(1, round((input_len - template) / slope))
    if words == default_words(input_len):
        return dataset
    note(
        f"the server counts {slope:.2f} tokens a synthetic word and {template:.0f} for the "
        f"chat template: prompts of {input_len} tokens are {words} words"
    )
    return synthetic(input_len, output_len, len(dataset.prompts), seed, words)
