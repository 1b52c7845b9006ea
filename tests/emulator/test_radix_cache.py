"""The emulator's radix cache: the tree itself, the prefill it saves, and what it reports."""

from __future__ import annotations

import time

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from specroute.emulator.engine import Sequence
from specroute.emulator.radix_cache import RadixCache
from specroute.emulator.vocabulary import chat_prompt_tokens, chat_tokens, tokens
from tests.emulator.test_emulator_api import metric
from tests.emulators import emulator_config, running_emulator


def toks(text: str) -> tuple[str, ...]:
    return tuple(text.split())


@pytest.mark.parametrize(
    ("held", "asked", "found"),
    [
        pytest.param([], "a b c", 0, id="empty"),
        pytest.param(["a b c d"], "a b c d", 4, id="whole"),
        pytest.param(["a b c d"], "a b x", 2, id="inside-an-edge"),
        pytest.param(["a b c d", "a b x y"], "a b x y z", 4, id="after-a-split"),
        pytest.param(["a b c d", "a b x y"], "a b c d", 4, id="the-split-keeps-the-old"),
        pytest.param(["a b"], "x a b", 0, id="a-prefix-not-a-substring"),
    ],
)
def test_match_finds_the_longest_cached_prefix(held: list[str], asked: str, found: int) -> None:
    cache = RadixCache(1000)
    for text in held:
        cache.insert(toks(text))
    assert cache.match(toks(asked)) == found


def test_shared_prefixes_are_held_once() -> None:
    cache = RadixCache(1000)
    cache.insert(toks("s s s s a"))
    cache.insert(toks("s s s s b"))
    cache.insert(toks("s s s s a"))
    assert cache.size == 6


def test_the_least_recently_used_prompt_goes_first() -> None:
    cache = RadixCache(8)
    cache.insert(toks("p q r s"))
    cache.insert(toks("w x y z"))
    cache.match(toks("p q r s"))  # used again: now w x y z is the oldest
    cache.insert(toks("e f g h"))
    assert cache.size <= 8
    assert cache.match(toks("p q r s")) == 4
    assert cache.match(toks("e f g h")) == 4
    assert cache.match(toks("w x y z")) == 0


def test_a_shared_prefix_outlives_its_branches() -> None:
    cache = RadixCache(7)
    cache.insert(toks("s s s a a"))
    cache.insert(toks("s s s b b"))  # 7 tokens: full
    cache.insert(toks("s s s c c"))  # the oldest branch goes, the stem stays
    assert cache.match(toks("s s s a a")) == 3
    assert cache.match(toks("s s s c c")) == 5
    assert cache.size == 7


def test_a_prompt_longer_than_the_cache_leaves_it_empty() -> None:
    cache = RadixCache(3)
    cache.insert(toks("a b"))
    cache.insert(toks("c d e f"))
    assert cache.size == 0
    assert cache.match(toks("a b")) == 0


def test_a_chat_is_tokenized_as_counted_and_shares_its_system_prompt() -> None:
    system: dict[str, object] = {"role": "system", "content": "You are terse, in one line."}
    one: list[dict[str, object]] = [system, {"role": "user", "content": "Hello there."}]
    two: list[dict[str, object]] = [system, {"role": "user", "content": "Goodbye."}]
    assert len(chat_tokens(one)) == chat_prompt_tokens(one)
    same = 0
    while chat_tokens(one)[same] == chat_tokens(two)[same]:
        same += 1
    assert same == 1 + 3 + len(tokens(str(system["content"]))) + 1 + 3


def _seq(rid: str, text: str) -> Sequence:
    ids = tokens(text)
    return Sequence(rid, text, len(ids), 1, ignore_eos=True, prompt_ids=ids)


def test_a_cached_prefix_is_not_prefilled_again() -> None:
    """In the engine model: the second prompt's shared prefix is neither computed nor
    charged, and a prompt wholly cached still computes its last token."""
    engine = emulator_config("--radix-cache-tokens", "100000").engine()
    prefix = "the model " * 1000
    first, second = _seq("a", prefix + "one"), _seq("b", prefix + "two")
    engine.submit(first)
    cold = engine.step()
    engine.submit(second)
    engine.submit(again := _seq("c", prefix + "one"))
    warm = engine.step()  # both in one batch, each matched against what was cached before
    assert cold is not None and warm is not None and warm.kind == "prefill"
    assert (cold.new_tokens, cold.cached_tokens) == (2001, 0)
    assert second.cached_tokens == 2000 and again.cached_tokens == 2000
    assert warm.cached_tokens == 4000 and warm.new_tokens == 2
    assert warm.duration < cold.duration / 5
    uncached = emulator_config().engine()
    uncached.submit(_seq("d", prefix + "two"))
    step = uncached.step()
    assert step is not None and (step.new_tokens, step.cached_tokens) == (2001, 0)


SYSTEM = "You answer questions about serving models. " + "the batch and the queue " * 600


async def test_a_repeated_prompt_reports_cached_tokens_and_a_shorter_ttft() -> None:
    flags = ("--mode", "base", "--time-scale", "0.1", "--radix-cache-tokens", "200000")
    async with running_emulator(*flags, "--enable-cache-report") as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        times, cached = [], []
        for question in ("Define a batch.", "What is a queue?"):
            messages: list[ChatCompletionMessageParam] = [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": question},
            ]
            started = time.monotonic()
            answer = await client.chat.completions.create(
                model="m", messages=messages, max_tokens=1
            )
            times.append(time.monotonic() - started)
            assert answer.usage is not None and answer.usage.prompt_tokens_details is not None
            cached.append(answer.usage.prompt_tokens_details.cached_tokens)
        system_tokens = 1 + 3 + len(tokens(SYSTEM)) + 1 + 3
        assert cached[0] == 0
        assert cached[1] == system_tokens  # up to the user message's content
        # the first pays ~0.2 s (2,400 tokens of prefill at 0.1x); the second a few ms
        assert times[1] < times[0] / 3, times
        async with aiohttp.ClientSession() as s:
            body = {"text": SYSTEM, "sampling_params": {"max_new_tokens": 1}}
            for _ in range(2):  # a bare text shares no tokens with a chat's template
                async with s.post(f"{url}/generate", json=body) as r:
                    meta = (await r.json())["meta_info"]
        assert meta["cached_tokens"] == len(tokens(SYSTEM)) - 1  # all but the last token
        assert meta["cached_tokens_details"] == {"device": meta["cached_tokens"], "host": 0}
        total = await metric(url, "sglang:cached_tokens_total")
        assert total == cached[1] + meta["cached_tokens"]
        assert await metric(url, "sglang:cache_hit_rate") > 0.99


async def test_without_the_report_the_usage_has_no_details() -> None:
    async with running_emulator("--mode", "base", "--time-scale", "0.05") as url:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Hi."}]
        for _ in range(2):
            answer = await client.chat.completions.create(
                model="m", messages=messages, max_tokens=1
            )
        assert answer.usage is not None and answer.usage.prompt_tokens_details is None
        assert await metric(url, "sglang:cached_tokens_total") == 0
