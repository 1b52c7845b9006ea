"""``/v1/responses`` with SGLang 0.5.23's shapes, for a model without a harmony template.

A request's ``input`` (a string, or message items whose content is a string or text parts)
after its ``instructions`` is a chat, and it makes two tokens fewer than its
``max_output_tokens`` (SGLang's headroom for the end tokens; under 2 is its 400). Streams
send SGLang's typed events, each as ``event:`` and ``data:`` lines numbered by
``sequence_number``, and end with ``response.completed`` (``response.incomplete``,
``response.failed``: as its status says), which carries the whole response
and its usage; no ``[DONE]``. Errors are nested as OpenAI's are (``{"error": {...}}``), not
in SGLang's flat shape.

Responses are kept only with ``--enable-response-store`` (SGLang's flag, off by default):
then ``store`` (true by default) keeps a response and the chat it ended, a later request
names it in ``previous_response_id`` to go on from there, ``GET /v1/responses/{id}``
answers it and ``POST /v1/responses/{id}/cancel`` stops it. Without the flag, each of
these is a 400 that says so.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson
from aiohttp import web

from specroute.emulator.engine import Sequence
from specroute.emulator.errors import BadRequest, read_json
from specroute.emulator.fault_injector import FaultInjector
from specroute.emulator.fields import whole_number
from specroute.emulator.loop import EngineLoop, QueueFull
from specroute.emulator.request import ActiveRequest
from specroute.emulator.vocabulary import chat_prompt_tokens, chat_tokens, message_text

PREFIX = "resp_"
_ENDS = ("completed", "incomplete", "failed")  # a stream's last event: response.<status>
_HEADROOM = 2  # SGLang keeps two of max_output_tokens for the end tokens the engine adds
_STORE_DISABLED = (
    "Response store is disabled. Stateful Responses require --enable-response-store on a "
    "standalone server; response storage is unavailable in PD mode."
)


class ResponsesError(Exception):
    """A refusal in the Responses API's nested shape."""

    def __init__(self, message: str, status: int = 400, param: str | None = None) -> None:
        super().__init__(message)
        self.message, self.status, self.param = message, status, param

    def response(self) -> web.Response:
        error = {
            "message": self.message,
            "type": "invalid_request_error",
            "param": self.param,
            "code": self.status,
        }
        return web.json_response({"error": error}, status=self.status)


@dataclass
class Stored:
    """A response kept, and the chat that made it (its input, then its answer)."""

    body: dict[str, Any]
    chat: list[dict[str, Any]]


@dataclass
class ResponsesHandlers:
    loop: EngineLoop
    context_length: int
    faults: FaultInjector
    model: str  # the served model's name: the only one a request may name
    store_enabled: bool = False  # SGLang's --enable-response-store
    kept: dict[str, Stored] = field(default_factory=dict)

    async def create(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_json(request)
            chat, seq, stream, store = self._parse(body)
        except ResponsesError as exc:
            return exc.response()
        except BadRequest as exc:
            return ResponsesError(exc.message, exc.status).response()
        head = self._head(body, seq.rid)
        active = ActiveRequest(self.loop, seq, streaming=stream)
        kept = Stored(head, chat) if store else None
        if kept is not None:
            self.kept[seq.rid] = kept
        if stream:
            return await self._stream(request, head, active, kept)
        try:
            await active.run_whole()
        except BadRequest as exc:  # a full queue
            head["status"] = "failed"
            return ResponsesError(exc.message, exc.status).response()
        return web.json_response(self._done(head, active, kept))

    async def retrieve(self, request: web.Request) -> web.Response:
        try:
            return web.json_response(self._kept(request.match_info["response_id"]).body)
        except ResponsesError as exc:
            return exc.response()

    async def cancel(self, request: web.Request) -> web.Response:
        try:
            kept = self._kept(request.match_info["response_id"])
        except ResponsesError as exc:
            return exc.response()
        if kept.body["status"] in ("queued", "in_progress"):
            kept.body["status"] = "cancelled"
            self.loop.abort(kept.body["id"])  # it ends now, as what it made so far
        return web.json_response(kept.body)

    def _kept(self, response_id: str) -> Stored:
        if not self.store_enabled:
            raise ResponsesError(_STORE_DISABLED, param="response_id")
        if not response_id.startswith("resp"):
            raise ResponsesError(
                f"Invalid 'response_id': '{response_id}'. Expected an ID that begins with 'resp'.",
                param="response_id",
            )
        kept = self.kept.get(response_id)
        if kept is None:
            raise ResponsesError(
                f"Response with id '{response_id}' not found.", 404, param="response_id"
            )
        return kept

    def _parse(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], Sequence, bool, bool]:
        """The chat the request continues or starts, its sequence, and whether it streams
        and is kept."""
        model = body.get("model")
        if model is not None and model != self.model:
            raise ResponsesError(f"The model '{model}' does not exist", 404, param="model")
        chat: list[dict[str, Any]] = []
        previous = body.get("previous_response_id")
        if previous is not None:
            if not self.store_enabled:
                raise ResponsesError(_STORE_DISABLED, param="previous_response_id")
            if not isinstance(previous, str):
                raise ResponsesError("previous_response_id must be a string.")
            chat = list(self._kept(previous).chat)
        instructions = body.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise ResponsesError("instructions must be a string.", param="instructions")
            chat = [{"role": "system", "content": instructions}, *chat]
        chat += _input_messages(body.get("input"))
        prompt_tokens = chat_prompt_tokens(chat)
        limit = body.get("max_output_tokens")
        max_tokens = self.context_length - prompt_tokens
        if limit is not None:
            number = whole_number(limit)
            if number is None:
                raise ResponsesError(
                    f"max_output_tokens must be an integer, got {limit!r}.",
                    param="max_output_tokens",
                )
            max_tokens = number - _HEADROOM
            if max_tokens < 0:
                raise ResponsesError(f"max_new_tokens must be at least 0, got {max_tokens}.")
        if prompt_tokens + max_tokens > self.context_length:
            raise ResponsesError(
                f"The input ({prompt_tokens} tokens) and max_output_tokens ({max_tokens}) "
                f"exceed the model's context length of {self.context_length} tokens.",
                param="input",
            )
        rid = body.get("request_id")
        if rid is not None and not isinstance(rid, str):
            raise ResponsesError("request_id must be a string.", param="request_id")
        seq = Sequence(
            rid=rid or f"{PREFIX}{uuid.uuid4().hex}",
            prompt="\n".join(message_text(m) for m in chat),
            prompt_tokens=prompt_tokens,
            max_new_tokens=max_tokens,
            ignore_eos=body.get("ignore_eos") is True,
            prompt_ids=chat_tokens(chat),
        )
        store = self.store_enabled and body.get("store", True) is not False
        return chat, seq, body.get("stream") is True, store

    def _head(self, body: dict[str, Any], rid: str) -> dict[str, Any]:
        """The response as SGLang's ``ResponsesResponse`` has it, its request's settings
        echoed, before any output."""
        parallel = body.get("parallel_tool_calls")
        return {
            "id": rid,
            "object": "response",
            "created_at": int(time.time()),
            "model": body.get("model") or self.model,
            "output": [],
            "status": "in_progress",
            "usage": None,
            "parallel_tool_calls": True if parallel is None else parallel,
            "tool_choice": "auto",
            "tools": [],
            "error": None,
            "incomplete_details": None,
            "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"),
            "previous_response_id": body.get("previous_response_id"),
            "reasoning": {"effort": None, "summary": None},
            "store": body.get("store", True),
            "temperature": body.get("temperature"),
            "text": None,
            "top_p": body.get("top_p"),
            "truncation": body.get("truncation", "disabled"),
            "user": body.get("user"),
            "metadata": body.get("metadata") or {},
        }

    @staticmethod
    def _done(head: dict[str, Any], active: ActiveRequest, kept: Stored | None) -> dict[str, Any]:
        """The response finished: its message, its status (``incomplete`` when it ran out
        of ``max_output_tokens``, ``failed`` when aborted), its usage; kept with the chat it
        ends."""
        seq = active.seq
        prompt, completion = seq.prompt_tokens, len(active.output_ids)
        reason = None if seq.finish is None else seq.finish.type
        status = {"length": "incomplete", "abort": "failed"}.get(reason or "", "completed")
        head["output"] = [_message(seq.rid, active.text, status)]
        head["text"] = {"format": {"type": "text"}}
        if head["status"] != "cancelled":
            head["status"] = status
        if status == "incomplete":
            head["incomplete_details"] = {"reason": "max_output_tokens"}
        head["usage"] = {
            "input_tokens": prompt,
            "input_tokens_details": {"cached_tokens": seq.cached_tokens, "cache_write_tokens": 0},
            "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion,
        }
        if kept is not None:
            kept.chat.append({"role": "assistant", "content": active.text})
        return head

    async def _stream(
        self, request: web.Request, head: dict[str, Any], active: ActiveRequest, kept: Stored | None
    ) -> web.StreamResponse:
        response = self.faults.event_stream(request)
        await response.prepare(request)
        events = _Events()
        rid = active.seq.rid
        message = _message(rid, "", "in_progress")
        part: dict[str, Any] = {
            "type": "output_text",
            "text": "",
            "annotations": [],
            "logprobs": None,
        }
        place = {"item_id": message["id"], "output_index": 0}
        try:
            await response.write(events("response.created", response=head))
            await response.write(events("response.in_progress", response=head))
            await response.write(events("response.output_item.added", output_index=0, item=message))
            await response.write(
                events("response.content_part.added", **place, content_index=0, part=part)
            )
            async with active:
                async for emission in active.emissions():
                    if emission.text:
                        delta = events(
                            "response.output_text.delta",
                            **place,
                            content_index=0,
                            delta=emission.text,
                        )
                        await response.write(delta)
        except QueueFull as exc:
            head["status"] = "failed"
            await response.write(events("error", message=str(exc), code="503"))
            await response.write_eof()
            return response
        except ConnectionResetError:  # the client left: its request is aborted
            return response
        text = active.text
        part = part | {"text": text}
        await response.write(
            events("response.output_text.done", **place, content_index=0, text=text)
        )
        await response.write(
            events("response.content_part.done", **place, content_index=0, part=part)
        )
        done = _message(rid, text, "completed")
        await response.write(events("response.output_item.done", output_index=0, item=done))
        final = self._done(head, active, kept)
        ended = final["status"] if final["status"] in _ENDS else "failed"
        await response.write(events(f"response.{ended}", response=final))
        await response.write_eof()
        return response


class _Events:
    """SGLang's typed events, numbered in order."""

    def __init__(self) -> None:
        self.sent = 0

    def __call__(self, kind: str, **fields: Any) -> bytes:
        payload = {"type": kind, "sequence_number": self.sent, **fields}
        self.sent += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


def _message(rid: str, text: str, status: str) -> dict[str, Any]:
    part: dict[str, Any] = {
        "type": "output_text",
        "text": text,
        "annotations": [],
        "logprobs": None,
    }
    return {
        "type": "message",
        "id": f"msg_{rid}",
        "role": "assistant",
        "status": status,
        "content": [part] if text else [],
        "phase": None,
    }


def _input_messages(given: Any) -> list[dict[str, Any]]:
    """``input`` as chat messages: a string is the user's; items are messages (a role, and
    content that is a string or text parts: ``input_text``, ``output_text``)."""
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise ResponsesError("input must be a string or a non-empty list of items.", param="input")
    messages = []
    for i, item in enumerate(given):
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            raise ResponsesError(f"input[{i}] must be a message item.", param="input")
        role, content = item.get("role"), item.get("content")
        if role not in ("user", "assistant", "system", "developer"):
            raise ResponsesError(f"input[{i}] has no valid role.", param="input")
        if not isinstance(content, str | list):
            raise ResponsesError(f"input[{i}].content must be a string or parts.", param="input")
        messages.append({"role": role, "content": content})
    return messages
