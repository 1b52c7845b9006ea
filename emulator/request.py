"""A request as its HTTP handler sees it: emissions in order, timed and counted.

The counting here mirrors SGLang's tokenizer side (tokens, requests, verify calls, TTFT,
inter-token latency, end-to-end latency); the scheduler-side gauges live in the loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from types import TracebackType

from specroute.emulator.engine import Emission, Finish, Sequence
from specroute.emulator.errors import BadRequest
from specroute.emulator.loop import EngineLoop, QueueFull


class ActiveRequest:
    def __init__(self, loop: EngineLoop, seq: Sequence, *, streaming: bool) -> None:
        self.loop = loop
        self.seq = seq
        self.streaming = streaming
        self.started = time.monotonic()
        self.first_token_at: float | None = None
        self.finished_at: float | None = None
        self.text = ""
        self.output_ids: list[int] = []
        self._queue: asyncio.Queue[Emission] = asyncio.Queue()
        self._last_at = self.started

    async def __aenter__(self) -> ActiveRequest:
        self.loop.submit(self.seq, self._queue.put_nowait)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """A handler that leaves early (client gone, error) aborts its request."""
        self.loop.release(self.seq.rid)

    @property
    def e2e_latency(self) -> float:
        return (self.finished_at or time.monotonic()) - self.started

    async def run_whole(self) -> None:
        """Runs the request to its end, for an answer sent whole; a full queue refuses it
        with SGLang's 503."""
        try:
            async with self:
                async for _ in self.emissions():
                    pass
        except QueueFull as exc:
            raise BadRequest(str(exc), 503, "503") from None

    async def emissions(self) -> AsyncIterator[Emission]:
        while True:
            emission = await self._queue.get()
            self.text += emission.text
            self.output_ids.extend(emission.ids)
            self._count(emission)
            yield emission
            if emission.finish is not None:
                return

    def _count(self, emission: Emission) -> None:
        m, now = self.loop.metrics, time.monotonic()
        streamed, plain = m.tokenizer_values(self.streaming), m.tokenizer_values()
        if emission.ids:
            if self.first_token_at is None:
                self.first_token_at = now
                m.bound(m.ttft, *streamed).observe(now - self.started)
            else:
                m.bound(m.itl, *plain).observe((now - self._last_at) / len(emission.ids))
            self._last_at = now
        if emission.finish is not None:
            self.finished_at = now
            m.bound(m.prompt_tokens, *streamed).inc(self.seq.prompt_tokens)
            m.bound(m.generation_tokens, *streamed).inc(len(self.output_ids))
            m.bound(m.num_requests, *streamed).inc()
            if self.seq.cached_tokens:
                m.bound(m.cached_tokens, *plain, "device").inc(self.seq.cached_tokens)
            m.bound(m.e2e, *streamed).observe(now - self.started)
            m.bound(m.spec_verify_calls, *plain).inc(self.seq.verify_ct)

    def meta_info(self) -> dict[str, object]:
        """``/generate``'s ``meta_info`` as delivered so far, with SGLang's finish-only
        fields once finished."""
        seq = self.seq
        finish = seq.finish if self.finished_at is not None else None
        info: dict[str, object] = {
            "id": seq.rid,
            "finish_reason": None if finish is None else finish_reason_dict(finish),
            "prompt_tokens": seq.prompt_tokens,
            "weight_version": "default",
            "num_retractions": 0,
            "reasoning_tokens": 0,
            "completion_tokens": len(self.output_ids),
            "cached_tokens": seq.cached_tokens,
        }
        if seq.cached_tokens:  # SGLang's breakdown by tier: here all on the device
            info["cached_tokens_details"] = {"device": seq.cached_tokens, "host": 0}
        if finish is not None:
            info["e2e_latency"] = self.e2e_latency
            info |= self.timing()
            details = self.spec_details()
            if details is not None:
                info |= {k: details[k] for k in _META_SPEC}
        return info

    def timing(self) -> dict[str, float]:
        """What SGLang's ``--enable-metrics`` (the emulator's) adds to a finished request's
        ``meta_info``: its first token's latency and its decode's output tokens after the
        first a second (none where it has no decode interval)."""
        first, end = self.first_token_at, self.finished_at
        if first is None or end is None:
            return {}
        found = {"first_token_latency": first - self.started}
        if len(self.output_ids) > 1 and end > first:
            found["decode_throughput"] = (len(self.output_ids) - 1) / (end - first)
        return found

    def spec_details(self) -> dict[str, object] | None:
        """SGLang's per-request speculation details (``SpecTokensDetails``), once it
        verified: its tokens over its verify steps (the bonus token counted), the drafts
        proposed counted as SGLang's tokenizer side counts them, from the configured draft
        tokens (``--speculative-num-steps`` with one branch) whatever depth an adaptive
        server ran; None on a plain server, or before a verify step."""
        seq, engine = self.seq, self.loop.engine
        if not engine.speculative or seq.verify_ct <= 0:
            return None
        tokens = len(self.output_ids)
        correct = max(0, tokens - seq.verify_ct)
        proposed = seq.verify_ct * engine.steps
        return {
            "spec_accept_rate": correct / proposed if proposed else 0.0,
            "spec_accept_length": tokens / seq.verify_ct,
            "spec_cap_length": 0.0,
            "spec_block_accept_length": 0.0,
            "spec_num_correct_drafts": correct,
            "spec_num_proposed_drafts": proposed,
            "spec_verify_ct": seq.verify_ct,
            "spec_correct_drafts_histogram": [],
            "spec_cap_lens_histogram": [],
        }


# the speculation details ``/generate``'s meta_info gives
_META_SPEC = ("spec_accept_length", "spec_accept_rate", "spec_verify_ct")


def finish_reason_dict(finish: Finish) -> dict[str, object]:
    if finish.type == "length":
        return {"type": "length", "length": finish.length}
    if finish.type == "stop":
        return {"type": "stop", "matched": finish.matched}
    return {
        "type": "abort",
        "message": "The request was aborted.",
        "status_code": 200,
        "err_type": None,
    }
