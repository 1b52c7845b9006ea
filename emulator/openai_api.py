"""``/v1/chat/completions`` and ``/v1/completions`` with SGLang 0.5.23's shapes.

Streaming chat sends a role chunk, content chunks, a separate finish chunk, the request's
speculation details (``sglext``, no choices) only when ``return_spec_tokens_details`` is set
on a speculative server, a usage chunk only when ``stream_options.include_usage`` is set,
then ``[DONE]``. A whole chat asked ``return_meta_info`` carries the request's ``meta_info``
in its choice, last, as ``/generate`` gives it (a stream asked it is refused, as SGLang
refuses it). Streaming completions
send no role chunk and carry ``finish_reason`` on the last content chunk.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from specroute.emulator.engine import Finish, Sequence
from specroute.emulator.errors import (
    BadRequest,
    error_body,
    read_json,
    sse_event,
    stream_error_event,
)
from specroute.emulator.fault_injector import FaultInjector
from specroute.emulator.fields import request_id, stop_strings, whole_number
from specroute.emulator.loop import EngineLoop, QueueFull
from specroute.emulator.request import ActiveRequest
from specroute.emulator.vocabulary import (
    chat_prompt_tokens,
    chat_tokens,
    count_tokens,
    message_text,
    tokens,
)

_ROLES = {"system", "user", "assistant", "tool", "developer", "function"}


@dataclass(frozen=True)
class Completion:
    """The parts of a chat or completions request the emulator acts on."""

    chat: bool
    model: str
    seq: Sequence
    stream: bool
    include_usage: bool
    continuous_usage: bool = False  # stream_options.continuous_usage_stats: usage per chunk
    spec_details: bool = False  # return_spec_tokens_details: sglext.spec_tokens_details
    meta_info: bool = False  # return_meta_info (a whole chat's): each choice's meta_info


def parse(body: dict[str, Any], *, chat: bool, context_length: int) -> Completion:
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            raise BadRequest("Field 'messages' is required and must be a list of messages.")
        if not messages:
            raise BadRequest("Messages cannot be empty.")
        for i, message in enumerate(messages):
            if not isinstance(message, dict) or message.get("role") not in _ROLES:
                raise BadRequest(f"messages[{i}] must be an object with a valid 'role'.")
        prompt = "\n".join(message_text(m) for m in messages)
        prompt_tokens, prompt_ids = chat_prompt_tokens(messages), chat_tokens(messages)
    else:
        prompt, prompt_tokens, prompt_ids = _completion_prompt(body.get("prompt"))
    n = body.get("n", 1)
    if n != 1:
        raise BadRequest("Only n=1 is supported by this server.")
    limit = body.get("max_completion_tokens") if chat else None
    if limit is None:
        limit = body.get("max_tokens", None if chat else 16)
    max_tokens = context_length - prompt_tokens if limit is None else _whole(limit, "max_tokens")
    if not chat and max_tokens <= 0:  # SGLang's CompletionRequest validates it so
        raise BadRequest("max_tokens must be positive")
    if prompt_tokens + max_tokens > context_length:
        raise BadRequest(
            f"Requested token count exceeds the model's maximum context length of "
            f"{context_length} tokens. You requested a total of {prompt_tokens + max_tokens} "
            f"tokens: {prompt_tokens} tokens from the input messages and {max_tokens} tokens "
            "for the completion. Please reduce the number of tokens in the input messages or "
            "the completion to fit within the limit."
        )
    stream = _flag(body, "stream")
    meta_info = chat and _flag(body, "return_meta_info")
    if stream and meta_info:  # SGLang 0.5.23's words
        raise BadRequest(
            "return_meta_info is not supported with streaming. "
            "Please set stream=false when using return_meta_info=true."
        )
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("Field 'stream_options' must be an object.")
    seq = Sequence(
        rid=request_id(body),
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_tokens,
        ignore_eos=_flag(body, "ignore_eos"),
        stop=stop_strings(body.get("stop"), "Field 'stop'"),
        sampling_seed=str(body.get("seed", "")),
        prompt_ids=prompt_ids,
    )
    model = body.get("model", "default")
    if not isinstance(model, str):
        raise BadRequest("Field 'model' must be a string.")
    return Completion(
        chat,
        model,
        seq,
        stream,
        include_usage=stream and bool(options.get("include_usage")),
        continuous_usage=stream and bool(options.get("continuous_usage_stats")),
        spec_details=_flag(body, "return_spec_tokens_details"),
        meta_info=meta_info,
    )


def _completion_prompt(prompt: Any) -> tuple[str, int, tuple[str, ...]]:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt, max(1, count_tokens(prompt)), tokens(prompt)
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        ids = tuple(map(str, prompt))
        return " ".join(ids), len(prompt), ids
    raise BadRequest("Field 'prompt' must be a string or a list of token ids (one prompt).")


def _whole(value: Any, name: str) -> int:
    number = whole_number(value)
    if number is None or number < 0:
        raise BadRequest(f"Field '{name}' must be a non-negative integer, got {value!r}.")
    return number


def _flag(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"Field '{name}' must be a boolean, got {value!r}.")
    return value


def _finish_reason(finish: Finish | None) -> str | None:
    return None if finish is None else finish.type


def _usage(active: ActiveRequest, cache_report: bool) -> dict[str, Any]:
    """SGLang's usage; the cached prompt tokens only with ``--enable-cache-report``."""
    completion, prompt = len(active.output_ids), active.seq.prompt_tokens
    details = None
    if cache_report:
        details = {
            "cached_tokens": active.seq.cached_tokens,
            "image_tokens": None,
            "audio_tokens": None,
            "video_tokens": None,
        }
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": details,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


@dataclass(frozen=True)
class OpenAIHandlers:
    loop: EngineLoop
    context_length: int
    faults: FaultInjector
    cache_report: bool = False  # SGLang's --enable-cache-report

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=True)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, chat=False)

    async def _serve(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        body = await read_json(request)
        completion = parse(body, chat=chat, context_length=self.context_length)
        active = ActiveRequest(self.loop, completion.seq, streaming=completion.stream)
        if completion.stream:
            return await self._stream(request, completion, active)
        await active.run_whole()
        return web.json_response(self._response(completion, active))

    def _response(self, c: Completion, active: ActiveRequest) -> dict[str, Any]:
        seq = c.seq
        finish = seq.finish
        matched = None if finish is None else finish.matched
        if c.chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": active.text, "reasoning_content": None},
            }
        else:
            choice = {"index": 0, "text": active.text}
        choice |= {
            "logprobs": None,
            "finish_reason": _finish_reason(finish),
            "matched_stop": matched,
        }
        if c.meta_info:  # SGLang writes it last
            choice["meta_info"] = active.meta_info()
        return {
            "id": seq.rid,
            "object": "chat.completion" if c.chat else "text_completion",
            "created": int(time.time()),
            "model": c.model,
            "choices": [choice],
            "usage": _usage(active, self.cache_report),
            "metadata": {"weight_version": "default"} if c.chat else None,
        } | _sglext(c, active)

    async def _stream(
        self, request: web.Request, c: Completion, active: ActiveRequest
    ) -> web.StreamResponse:
        response = self.faults.event_stream(request)
        await response.prepare(request)
        created = int(time.time())
        seq = c.seq
        head = {
            "id": seq.rid,
            "object": "chat.completion.chunk" if c.chat else "text_completion",
            "created": created,
            "model": c.model,
        }
        try:
            async with active:
                first = True
                async for emission in active.emissions():
                    if c.chat:

                        def chunk(delta: dict[str, Any], finish: Finish | None = None) -> bytes:
                            usage = (
                                {"usage": _usage(active, self.cache_report)}
                                if c.continuous_usage
                                else {}
                            )
                            return sse_event(
                                head | {"choices": [_chat_choice(delta, finish)]} | usage
                            )

                        if first and (emission.text or emission.finish is not None):
                            role = {"role": "assistant", "content": ""}
                            await response.write(chunk({"reasoning_content": None} | role))
                            first = False
                        if emission.text:
                            content = {"content": emission.text}
                            await response.write(chunk({"reasoning_content": None} | content))
                        if emission.finish is not None:
                            await response.write(
                                chunk({"reasoning_content": None}, emission.finish)
                            )
                    elif emission.text or emission.finish is not None:
                        choice = {
                            "index": 0,
                            "text": emission.text,
                            "logprobs": None,
                            "finish_reason": _finish_reason(emission.finish),
                            "matched_stop": None
                            if emission.finish is None
                            else emission.finish.matched,
                        }
                        usage = _usage(active, self.cache_report) if c.continuous_usage else None
                        await response.write(
                            sse_event(head | {"choices": [choice], "usage": usage})
                        )
        except QueueFull as exc:
            await response.write(stream_error_event(str(exc), 503))
        except ConnectionResetError:  # the client left mid-answer: its request is aborted,
            return response  # and aiohttp closes the stream quietly
        else:
            if sglext := _sglext(c, active):  # SGLang's own event, before the usage
                await response.write(sse_event(head | {"choices": [], "usage": None} | sglext))
            if c.include_usage:
                usage = _usage(active, self.cache_report)
                if not c.chat:
                    usage = {k: v for k, v in usage.items() if v is not None}
                await response.write(sse_event(head | {"choices": [], "usage": usage}))
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _sglext(c: Completion, active: ActiveRequest) -> dict[str, Any]:
    """The answer's ``sglext`` where the client asked for the speculation details and the
    server has them (SGLang leaves out an empty one)."""
    details = active.spec_details() if c.spec_details else None
    return {} if details is None else {"sglext": {"spec_tokens_details": details}}


def _chat_choice(delta: dict[str, Any], finish: Finish | None = None) -> dict[str, Any]:
    return {
        "index": 0,
        "delta": delta,
        "logprobs": None,
        "finish_reason": _finish_reason(finish),
        "matched_stop": None if finish is None else finish.matched,
    }


__all__ = ["OpenAIHandlers", "error_body", "parse"]
