"""The numbers routing needs, read from a backend's Prometheus text by the project's one
reader (``specroute.prometheus``); ``parse`` is pure, tested on captured scrapes.

Understands SGLang (``sglang:``) and vLLM (``vllm:``) names. Counts add up over label sets
(one engine reports per data-parallel rank); the accept-length gauge is averaged over them.
SGLang's per-priority breakdown (``priority="<n>"``) repeats its total, so it is skipped.
Counters are kept raw: the poller takes deltas between two snapshots for a window's accept
length, never the cumulative average.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from specroute import prometheus

_SUMMED = {
    "running": ("sglang:num_running_reqs", "vllm:num_requests_running"),
    "queued": ("sglang:num_queue_reqs", "vllm:num_requests_waiting"),
    "generation_tokens": ("sglang:generation_tokens_total", "vllm:generation_tokens_total"),
    "verify_calls": ("sglang:spec_verify_calls_total", "vllm:spec_decode_num_drafts_total"),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
}
_AVERAGED = {"accept_length_gauge": ("sglang:spec_accept_length",)}
_WANTED = {n for names in (_SUMMED | _AVERAGED).values() for n in names}


@dataclass(frozen=True)
class BackendStats:
    """One scrape; ``None`` where the backend does not report the number."""

    running: float | None = None
    queued: float | None = None
    accept_length_gauge: float | None = None
    generation_tokens: float | None = None
    verify_calls: float | None = None
    accepted_tokens: float | None = None


def parse(text: str) -> BackendStats:
    values = prometheus.values(text, _WANTED, keep=lambda labels: not labels.get("priority"))
    found: dict[str, float | None] = {}
    for field, names in _SUMMED.items():
        found[field] = next((math.fsum(values[n]) for n in names if n in values), None)
    for field, names in _AVERAGED.items():
        found[field] = next((statistics.fmean(values[n]) for n in names if n in values), None)
    return BackendStats(**found)


def _delta(old: float | None, new: float | None) -> float | None:
    """A counter's growth between two scrapes: a series not yet created counts as 0, and
    a counter that went down (the backend restarted) counts from 0."""
    if new is None:
        return None
    old = old or 0.0
    return new - old if new >= old else new


def window_accept_length(old: BackendStats, new: BackendStats) -> float | None:
    """Tokens per verify step between two scrapes (SGLang: generation tokens over verify
    calls; vLLM: 1 + accepted over drafts); None when nothing was verified."""
    verifies = _delta(old.verify_calls, new.verify_calls)
    if verifies is None or verifies <= 0:
        return None
    accepted = _delta(old.accepted_tokens, new.accepted_tokens)
    if accepted is not None:
        return 1.0 + accepted / verifies
    tokens = _delta(old.generation_tokens, new.generation_tokens)
    return None if tokens is None else tokens / verifies
