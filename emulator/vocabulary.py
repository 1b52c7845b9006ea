"""The emulator's stand-in tokenizer: words and punctuation in, plain English words out."""

from __future__ import annotations

import re

from specroute.emulator.memo import by_text

_TOKEN = re.compile(r"\w+|[^\w\s]")

WORDS: tuple[str, ...] = tuple(
    [
        "the",
        "of",
        "and",
        "to",
        "in",
        "a",
        "is",
        "that",
        "for",
        "it",
        "as",
        "was",
        "with",
        "be",
        "by",
        "on",
        "not",
        "he",
        "this",
        "are",
        "or",
        "his",
        "from",
        "at",
        "which",
        "but",
        "have",
        "an",
        "they",
        "you",
        "were",
        "her",
        "she",
        "there",
        "one",
        "all",
        "we",
        "their",
        "can",
        "has",
        "been",
        "if",
        "more",
        "when",
        "will",
        "would",
        "who",
        "so",
        "no",
        "model",
        "token",
        "draft",
        "batch",
        "step",
        "speed",
        "route",
        "verify",
        "accept",
        "queue",
        "server",
        "request",
        "stream",
        "latency",
        "through",
        "output",
        "input",
        "decode",
        "prefill",
        "cache",
        "graph",
        "policy",
        "load",
        "expert",
        "layer",
        "time",
        "faster",
        "slower",
        "every",
        "other",
        "some",
        "many",
        "few",
        "each",
        "both",
        "same",
        "first",
        "last",
        "next",
    ]
)
TOKEN_ID_BASE = 1000
EOS_TOKEN_ID = 2


@by_text
def count_tokens(text: str) -> int:
    return len(_TOKEN.findall(text))


def tokens(text: str) -> tuple[str, ...]:
    """The tokens ``count_tokens`` counts, in order: what the radix cache keys on."""
    return tuple(_TOKEN.findall(text))


def word(token_id: int) -> str:
    return " " + WORDS[(token_id - TOKEN_ID_BASE) % len(WORDS)]


def chat_prompt_tokens(messages: list[dict[str, object]]) -> int:
    """Tokens of a chat after a Llama-3-style template: four per message plus the content."""
    total = 1
    for message in messages:
        total += 4 + count_tokens(message_text(message))
    return total + 3


def chat_tokens(messages: list[dict[str, object]]) -> tuple[str, ...]:
    """A chat's tokens after that template, as many as ``chat_prompt_tokens`` counts: a
    begin token, each message's header (three) and end (one) around its content, then the
    assistant's header; two chats that begin alike share their first tokens."""
    out = ["<|begin_of_text|>"]
    for message in messages:
        out += ["<|start_header_id|>", str(message.get("role")), "<|end_header_id|>"]
        out += tokens(message_text(message))
        out.append("<|eot_id|>")
    out += ["<|start_header_id|>", "assistant", "<|end_header_id|>"]
    return tuple(out)


def message_text(message: dict[str, object]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""
