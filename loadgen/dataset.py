"""Prompts for a sweep: synthetic with given lengths, a ShareGPT file, or the user's JSONL.

Acceptance depends on the text, so the user's own prompts measure what their traffic gets.
Every source yields chat requests (``messages`` and ``max_tokens``); a fingerprint of the
prompts goes into the profile so it can tell which workload it was measured on.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

Kind = Literal["synthetic", "sharegpt", "jsonl"]

_WORDS = [
    "time",
    "person",
    "year",
    "way",
    "day",
    "thing",
    "man",
    "world",
    "life",
    "hand",
    "part",
    "child",
    "eye",
    "woman",
    "place",
    "work",
    "week",
    "case",
    "point",
    "government",
    "company",
    "number",
    "group",
    "problem",
    "fact",
    "be",
    "have",
    "do",
    "say",
    "get",
    "make",
    "go",
    "know",
    "take",
    "see",
    "come",
    "think",
    "look",
    "want",
    "give",
    "use",
    "find",
    "tell",
    "ask",
    "seem",
    "feel",
    "try",
    "leave",
    "call",
    "good",
    "new",
    "first",
    "last",
    "long",
    "great",
    "little",
    "own",
    "other",
    "old",
    "right",
    "big",
    "high",
    "different",
    "small",
    "large",
    "next",
]
_TEMPLATE_TOKENS = 8  # a one-message chat template adds about this many tokens


class DatasetError(ValueError):
    """A dataset that cannot be used, with the reason."""


@dataclass(frozen=True)
class Prompt:
    messages: tuple[dict[str, str], ...]
    max_tokens: int

    def body(self) -> dict[str, Any]:
        return {"messages": list(self.messages), "max_tokens": self.max_tokens}

    @property
    def text_bytes(self) -> int:
        """UTF-8 bytes of the messages' text: over them, the prompt tokens a server counts
        give the tokens per byte by which a router estimates a request's context."""
        return sum(len(str(m.get("content", "")).encode()) for m in self.messages)


@dataclass(frozen=True)
class Dataset:
    kind: Kind
    prompts: tuple[Prompt, ...]
    source: str

    def fingerprint(self) -> str:
        digest = hashlib.sha256()
        for prompt in self.prompts:
            digest.update(json.dumps(prompt.body(), sort_keys=True).encode())
        return digest.hexdigest()[:16]

    def describe(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "source": self.source,
            "prompts": len(self.prompts),
            "fingerprint": self.fingerprint(),
        }


@functools.lru_cache(maxsize=8)  # each policy of a comparison draws the same ones
def synthetic(
    input_len: int, output_len: int, count: int = 256, seed: int = 0, words: int | None = None
) -> Dataset:
    """Random words, one word about one token, so prompts are about ``input_len`` tokens;
    ``words``: this many words a prompt instead, where a server's tokenizer was found to
    count otherwise (``loadgen.prompt_fit``)."""
    rng = random.Random(seed)
    k = default_words(input_len) if words is None else words
    prompts = tuple(
        Prompt(({"role": "user", "content": words_text(rng, k)},), output_len) for _ in range(count)
    )
    fitted = "" if words is None else f":words={words}"
    return Dataset("synthetic", prompts, f"synthetic:{input_len}:{output_len}:{seed}{fitted}")


def default_words(input_len: int) -> int:
    """The words of a synthetic prompt of ``input_len`` tokens, a word a token."""
    return max(1, input_len - _TEMPLATE_TOKENS)


def words_text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(_WORDS, k=words))


def synthetic_asked(dataset: Dataset) -> tuple[int, int, int] | None:
    """The input length, output length and seed a synthetic dataset was drawn for, or None
    for another kind (or one already fitted to a server)."""
    kind, *numbers = dataset.source.split(":")
    if kind != "synthetic" or len(numbers) != 3:
        return None
    input_len, output_len, seed = (int(n) for n in numbers)
    return input_len, output_len, seed


def synthetic_tokens_per_byte(input_lens: list[int], output_len: int) -> float:
    """Prompt tokens per byte of ``synthetic`` prompts of these lengths, each taken as
    ``input_len`` tokens (as the emulator's engine takes them, template included)."""
    sets = [synthetic(n, output_len) for n in input_lens]
    tokens = sum(n * len(s.prompts) for n, s in zip(input_lens, sets, strict=True))
    return tokens / sum(p.text_bytes for s in sets for p in s.prompts)


def sharegpt(path: Path, output_len: int | None, count: int = 1000) -> Dataset:
    """The first human turn of each conversation; the reply's word count as ``max_tokens``
    unless ``output_len`` fixes it."""
    data = _read_json(path)
    if not isinstance(data, list):
        raise DatasetError(f"{path}: a ShareGPT file is a JSON list of conversations")
    prompts = []
    for item in data:
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, reply = turns[0], turns[1]
        if not isinstance(first, dict) or first.get("from") != "human":
            continue
        text = str(first.get("value", ""))
        answer = str(reply.get("value", "")) if isinstance(reply, dict) else ""
        if text.strip():
            tokens = output_len or max(4, len(answer.split()))
            prompts.append(Prompt(({"role": "user", "content": text},), tokens))
        if len(prompts) == count:
            break
    if not prompts:
        raise DatasetError(f"{path}: no conversation starts with a human turn")
    return Dataset("sharegpt", tuple(prompts), str(path))


def jsonl(path: Path, output_len: int) -> Dataset:
    """One request a line: ``{"prompt": "..."}`` or ``{"messages": [...]}``, optionally
    with ``max_tokens``."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{path}:{number}: not JSON: {exc.msg}") from None
        if not isinstance(item, dict):
            raise DatasetError(f"{path}:{number}: expected an object")
        if isinstance(item.get("messages"), list):
            messages = tuple(item["messages"])
        elif isinstance(item.get("prompt"), str):
            messages = ({"role": "user", "content": item["prompt"]},)
        else:
            raise DatasetError(f"{path}:{number}: needs 'prompt' (text) or 'messages' (list)")
        tokens = item.get("max_tokens", output_len)
        if not isinstance(tokens, int) or tokens < 1:
            raise DatasetError(f"{path}:{number}: max_tokens must be a positive integer")
        prompts.append(Prompt(messages, tokens))
    if not prompts:
        raise DatasetError(f"{path}: no prompts")
    return Dataset("jsonl", tuple(prompts), str(path))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: not JSON: {exc.msg}") from None
