"""SGLang's native ``/generate`` (cumulative streaming) and ``/abort_request``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web

from specroute.emulator.engine import Sequence
from specroute.emulator.errors import BadRequest, read_json, sse_event
from specroute.emulator.fault_injector import FaultInjector
from specroute.emulator.fields import request_id, stop_strings, whole_number
from specroute.emulator.loop import EngineLoop, QueueFull
from specroute.emulator.request import ActiveRequest
from specroute.emulator.vocabulary import count_tokens, tokens


def parse_generate(body: dict[str, Any], context_length: int) -> tuple[Sequence, bool]:
    text, ids = body.get("text"), body.get("input_ids")
    if isinstance(text, list) or (isinstance(ids, list) and ids and isinstance(ids[0], list)):
        raise BadRequest("Batched /generate requests are not supported by this server.")
    if isinstance(text, str):
        prompt, prompt_tokens, prompt_ids = text, max(1, count_tokens(text)), tokens(text)
    elif isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids):
        prompt_ids = tuple(map(str, ids))
        prompt, prompt_tokens = " ".join(prompt_ids), len(ids)
    else:
        raise BadRequest("Either 'text' (a string) or 'input_ids' (a list of ints) is required.")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("Field 'sampling_params' must be an object.")
    given = params.get("max_new_tokens", 128)
    max_new = whole_number(given)
    if max_new is None or max_new < 0:
        raise BadRequest(f"max_new_tokens must be a non-negative integer, got {given!r}.")
    if prompt_tokens + max_new > context_length:
        raise BadRequest(
            f"The input ({prompt_tokens} tokens) plus max_new_tokens ({max_new}) is longer "
            f"than the model's context length ({context_length} tokens)."
        )
    seq = Sequence(
        rid=request_id(body),
        prompt=prompt,
        prompt_tokens=prompt_tokens,
        max_new_tokens=max_new,
        ignore_eos=bool(params.get("ignore_eos", False)),
        stop=stop_strings(params.get("stop"), "sampling_params.stop"),
        sampling_seed=str(params.get("sampling_seed", "")),
        prompt_ids=prompt_ids,
    )
    return seq, bool(body.get("stream", False))


@dataclass(frozen=True)
class NativeHandlers:
    loop: EngineLoop
    context_length: int
    faults: FaultInjector

    async def generate(self, request: web.Request) -> web.StreamResponse:
        seq, stream = parse_generate(await read_json(request), self.context_length)
        active = ActiveRequest(self.loop, seq, streaming=stream)
        if not stream:
            await active.run_whole()
            return web.json_response(self._payload(active))
        response = self.faults.event_stream(request)
        await response.prepare(request)
        try:
            async with active:
                async for emission in active.emissions():
                    if emission.ids or emission.finish is not None:
                        await response.write(sse_event(self._payload(active)))
        except QueueFull as exc:
            error = {"message": str(exc), "type": "SERVICE_UNAVAILABLE", "code": 503}
            await response.write(sse_event({"error": error}))
        except ConnectionResetError:  # the client left mid-answer: its request is aborted,
            return response  # and aiohttp closes the stream quietly
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    def _payload(self, active: ActiveRequest) -> dict[str, Any]:
        return {
            "text": active.text,
            "output_ids": list(active.output_ids),
            "meta_info": active.meta_info(),
        }

    async def abort_request(self, request: web.Request) -> web.Response:
        body = await read_json(request)
        if body.get("abort_all"):
            self.loop.abort_all()
        elif isinstance(body.get("rid"), str) and body["rid"]:
            self.loop.abort(body["rid"])
        return web.Response(status=200)
