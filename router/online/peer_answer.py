"""What one router replica answers another at ``GET /router/online/samples``: its own
samples since a cursor, written (``answer``) and read back (``parse``), pure.

A sample's time goes as its age at the answer, not as a monotonic time: clocks differ
between hosts, and a monotonic one has an origin of its own in each. The reader turns
ages into its own monotonic times at receipt, so a sample is late by the answer's travel
time, milliseconds beside a window of minutes.

The reader believes nothing: a row that is not a pool (``spec`` or ``base``), finite
numbers, a load of at least 0, a TPOT above 0, a context of whole tokens, and an age of at
least 0 and no older than its own online window is dropped, and the rows dropped are
counted, never silently. A row's accept length (its server's at its end) is optional: absent
or null, unknown (the plain pool's, or an answer of a replica that does not send it); given,
a number above 0, or the row is dropped. So is its load beside (the other pool's on its
GPUs): absent or null, unknown, and such a sample is not taken for one alone on its GPUs;
given, a number of at least 0. So is its draft depth (its server's at its end, SGLang's
``spec_num_steps``): absent or null, unknown, and compared with the pool's accept length
whatever depth it was read at; given, a number of at least 0. So is its prefill (the prompt
tokens sent to its GPUs while it decoded, per output token): absent or null, unknown, and
the sample is read as measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field

from specroute.online.samples import Sample
from specroute.policies.view import MAX_CONTEXT, POOLS, Pool

SAMPLES_PATH = "/router/online/samples"


class BadAnswer(ValueError):
    """An answer that is not of the shape: no epoch, cursor or list of samples."""


@dataclass(frozen=True)
class PeerAnswer:
    epoch: str  # the peer's rings', new when it starts again
    next: str  # the cursor to ask from next time
    samples: list[Sample]  # the rows that read, at the reader's monotonic times
    dropped: int  # the rows that did not


class SampleRow(BaseModel):
    age: float = Field(description="Seconds since the request ended.")
    pool: Pool
    load: float = Field(description="The mean load it decoded under.")
    tpot: float = Field(description="Seconds per output token.")
    context: int = Field(description="Its estimated KV tokens while it decoded.")
    accept_length: float | None = Field(description="Its server's at its end; null: unknown.")
    beside: float | None = Field(description="The other pool's load on its GPUs.")
    depth: float | None = Field(
        None, description="Its server's draft depth at its end; null or absent: unknown."
    )
    prefill: float | None = Field(
        None,
        description="The prompt tokens sent to its GPUs while it decoded, per output token; "
        "null or absent: unknown.",
    )


class SamplesAnswer(BaseModel):
    """``GET /router/online/samples``: this replica's own samples since a cursor."""

    epoch: str = Field(description="The rings'; a new one when the replica starts again.")
    next: str = Field(description="The cursor to ask from next time (`after`).")
    samples: list[SampleRow]


def answer(epoch: str, cursor: str, samples: Sequence[Sample], now: float) -> dict[str, Any]:
    """The answer to a peer: ``samples`` (monotonic times) as ages at ``now``, checked
    against its model as it goes."""
    rows = [
        {
            "age": max(0.0, now - s.at),
            "pool": s.pool,
            "load": s.load,
            "tpot": s.tpot,
            "context": s.context,
            "accept_length": s.accept_length,
            "beside": s.beside if math.isfinite(s.beside) else None,
            "depth": s.depth,
            "prefill": s.prefill,
        }
        for s in samples
    ]
    done = {"epoch": epoch, "next": cursor, "samples": rows}
    SamplesAnswer.model_validate(done)
    return done


def parse(document: object, received: float, max_age: float) -> PeerAnswer:
    """A peer's answer, its rows' ages turned into monotonic times at ``received``; raises
    ``BadAnswer`` when it is not of the shape."""
    if not isinstance(document, dict):
        raise BadAnswer("not a JSON object")
    epoch, cursor, rows = document.get("epoch"), document.get("next"), document.get("samples")
    if not isinstance(epoch, str) or not isinstance(cursor, str) or not isinstance(rows, list):
        raise BadAnswer("no epoch, next or samples")
    samples = [s for row in rows if (s := _sample(row, received, max_age)) is not None]
    return PeerAnswer(epoch, cursor, samples, len(rows) - len(samples))


def _sample(row: object, received: float, max_age: float) -> Sample | None:
    if not isinstance(row, dict):
        return None
    pool, context = row.get("pool"), row.get("context")
    age, load, tpot = (_number(row.get(k)) for k in ("age", "load", "tpot"))
    if pool not in POOLS or age is None or load is None or tpot is None:
        return None
    if not (0 <= age <= max_age and load >= 0 and tpot > 0):
        return None
    if isinstance(context, bool) or not isinstance(context, int):
        return None
    if not 0 <= context <= MAX_CONTEXT:
        return None
    try:
        accept = _optional(row, "accept_length", above_zero=True)
        beside = _optional(row, "beside")
        depth = _optional(row, "depth")
        prefill = _optional(row, "prefill")
    except _Unread:
        return None
    if beside is None:
        beside = math.inf  # unknown: never taken for alone on its GPUs
    pool = POOLS[POOLS.index(pool)]
    at = received - age
    return Sample(at, pool, float(load), float(tpot), context, accept, beside, depth, prefill)


class _Unread(ValueError):
    """An optional field given, but not as the number it must be: the row is dropped."""


def _optional(row: dict[str, Any], name: str, above_zero: bool = False) -> float | None:
    """``row``'s optional number ``name``: None when absent or null; at least 0 (above
    0 with ``above_zero``), else ``_Unread``."""
    given = row.get(name)
    if given is None:
        return None
    number = _number(given)
    if number is None or number < 0 or (above_zero and number == 0):
        raise _Unread(name)
    return number


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None
