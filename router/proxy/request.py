"""What a policy may know of a request, read from its parsed body on every request.

No tokenizer on this path: the prompt is measured in UTF-8 bytes of its text (a policy
turns them into tokens with its profile's ratio), and a prompt given as token ids is
counted as it is. Only the fields each API puts its prompt in are read: chat
``messages`` (a string ``content``, or the ``text`` of each part of a list), the Responses
API's ``instructions`` and ``input`` (a string, or items read as messages), completions'
``prompt``, and ``/generate``'s ``text`` or ``input_ids``; anything else counts nothing.
What a response goes on from (``previous_response_id``) is on its server, not counted.
A placement that keys on the prompt's beginning gets its first bytes too (``prefix``).
"""

from __future__ import annotations

from typing import Any

from specroute.policies.view import RequestInfo


def request_info(path: str, body: dict[str, Any], prefix_bytes: int = 0) -> RequestInfo:
    if path == "/v1/responses":  # read as the chat it is
        messages = _responses_messages(body)
        body = {
            "messages": messages,
            "stream": body.get("stream"),
            "max_tokens": body.get("max_output_tokens"),
        }
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
        prefix=prefix(body, prefix_bytes) if prefix_bytes else b"",
    )


def _responses_messages(body: dict[str, Any]) -> list[Any]:
    """The Responses API's ``instructions`` and ``input`` as a chat's messages."""
    given = body.get("input")
    instructions = body.get("instructions")
    messages: list[Any] = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(given, str):
        return [*messages, {"role": "user", "content": given}]
    return messages + given if isinstance(given, list) else messages


def _whole(value: Any) -> int | None:
    """An integer as the servers read one: ``5`` or ``5.0``, not ``5.5`` nor ``true``."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def prefix(body: dict[str, Any], size: int) -> bytes:
    """The first ``size`` bytes of the prompt as the server's template begins it: a chat's
    messages in order, each its role and text (so a system prompt, then the first turns);
    a prompt's text; token ids as decimal text. Empty for a body with no prompt."""
    pieces: list[str] = []
    length = 0
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in messages:
            if isinstance(m, dict):
                piece = f"{m.get('role')}\x1f{_text(m.get('content'))}\x1e"
                pieces.append(piece[:size])
                length += len(piece)
                if length >= size:
                    break
    else:
        for value in (body.get("prompt"), body.get("text"), body.get("input_ids")):
            if isinstance(value, list) and len(value) == 1 and isinstance(value[0], list):
                value = value[0]  # one prompt of token ids, as a batch of one
            if isinstance(value, str):
                pieces.append(value[:size])
            elif isinstance(value, list) and value and isinstance(value[0], str):
                pieces.append(value[0][:size])  # a batch: its first prompt
            elif isinstance(value, list):
                pieces.append(",".join(str(t) for t in value[: size // 2 + 1]))
    return "".join(pieces).encode("utf-8", "surrogatepass")[:size]


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


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
