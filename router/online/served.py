"""A served request's online sample: at the mean load it decoded under, with the other
pool's part of it, the prompts its GPUs were sent meanwhile, its time per output token and
its accept length (its own, else its server's at its end)."""

from __future__ import annotations

import time

from specroute.online.samples import Sample, decoded_under
from specroute.router.backends.flight import Flight, usage
from specroute.router.protocol.outcome import Outcome


def sample_of(
    flight: Flight, accept_length: float | None, depth: float | None = None
) -> Sample | None:
    """The sample ``flight`` makes at its end, if it makes one: an answer of two tokens or
    more, a stream timed from its first byte, a whole answer by its ``meta_info`` (the
    server's decode time, ``whole_timing``). Its load is the one it joined without the load
    lived through since its first byte (a whole answer's: since its dispatch);
    ``accept_length`` and ``depth``: its server's live ones now (None: unknown; the plain
    pool's are not kept), the accept length the request's own where its answer
    gave it (SGLang's speculation details: its tokens over its verify steps). The depth is
    the server's: SGLang 0.5.23 counts a request's proposed drafts from the configured draft
    tokens, not from the depth an adaptive server ran it at."""
    if flight.outcome is not Outcome.ANSWERED or flight.status != 200:
        return None
    began, decode = (flight.first_at, None) if flight.stream else (None, flight.tpot)
    if began is None and decode is None:
        return None  # a stream not begun; a whole answer whose ``meta_info`` gave no time
    tokens = usage(flight.tail).get("completion_tokens")
    if tokens is None or tokens < 2:
        return None
    now = time.monotonic()
    tpot = (now - began) / (tokens - 1) if began is not None else (decode or 0.0)
    load, beside, prefill = float(flight.joined), 0.0, None
    if flight.lived is not None and flight.lived_first is not None and now > flight.lived_at:
        seconds = now - flight.lived_at
        load, beside, prefill = decoded_under(
            flight.lived_first, flight.lived(now), seconds, tokens
        )
    pool, context = flight.backend.pool, flight.context
    if pool != "spec":
        return Sample(now, pool, load, tpot, context, None, beside, None, prefill)
    accepted = flight.accept_length if flight.accept_length is not None else accept_length
    return Sample(now, pool, load, tpot, context, accepted, beside, depth, prefill)
