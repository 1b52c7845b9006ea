"""What a policy may know of a request, read from its parsed body on every request.

No tokenizer on this path: the prompt is measured in UTF-8 bytes of its text (a policy
turns them into tokens with its profile's ratio), and a prompt given as token ids is
counted as it is. Only the fields each API puts its prompt in are read: chat
``messages`` (a string ``content``, or the ``text`` of each part of a list), completions'
``prompt``, and ``/generate``'s ``text`` or ``input_ids``; anything else counts nothing.
"""

from __future__ import annotations

from typing import Any

from specroute.policies.view import RequestInfo


def request_info(path: str, body: dict[str, Any]) -> RequestInfo:
    max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
    params = body.get("sampling_params")
    if max_tokens is None and isinstance(params, dict):
        max_tokens = params.get("max_new_tokens")
    text, ids = _prompt(body)
    return RequestInfo(
        path=path,
        stream=bool(body.get("stream", False)),
        max_tokens=_whole(max_tokens),
        prompt_bytes=text,
        prompt_tokens=ids,
    )


def _whole(value: Any) -> int | None:
    """An integer as the servers read one: ``5`` or ``5.0``, not ``5.5`` nor ``true``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _prompt(body: dict[str, Any]) -> tuple[int, int]:
    """The prompt's bytes of text, and its token ids."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return sum([_content(m.get("content")) for m in messages if isinstance(m, dict)]), 0
    text = ids = 0
    for value in (body.get("prompt"), body.get("text"), body.get("input_ids")):
        if isinstance(value, str):
            text += _utf8(value)
        elif isinstance(value, list):  # a batch of prompts, or token ids
            for item in value:
                if isinstance(item, str):
                    text += _utf8(item)
                elif isinstance(item, int):
                    ids += 1
                elif isinstance(item, list):
                    ids += len(item)
    return text, ids


def _content(content: Any) -> int:
    """A chat message's text: a string, or the text parts of a list (images count none)."""
    if isinstance(content, str):
        return _utf8(content)
    if not isinstance(content, list):
        return 0
    return sum(
        [
            _utf8(p["text"])
            for p in content
            if isinstance(p, dict) and isinstance(p.get("text"), str)
        ]
    )


def _utf8(text: str) -> int:
    """Bytes in UTF-8 without encoding ASCII (CPython knows a string is ASCII without
    reading it, and then a character is a byte); a lone surrogate, which JSON allows,
    counts its three bytes."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
