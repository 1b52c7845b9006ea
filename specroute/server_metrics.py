"""The numbers routing needs, read from a backend's Prometheus text by the project's one
reader (``specroute.prometheus``); ``parse`` is pure, tested on captured scrapes.

Understands SGLang (``sglang:``) and vLLM (``vllm:``) names. Counts add up over label sets
(one engine reports per data-parallel rank); the accept-length gauge is averaged over them.
SGLang's per-priority breakdown (``priority="<n>"``) repeats its total, so it is skipped.
Counters are kept raw: where the engine exports no accept-length gauge, the poller takes
deltas between two snapshots for a window's accept length, never the cumulative average.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace

from specroute import prometheus

_SUMMED = {
    "running": ("sglang:num_running_reqs", "vllm:num_requests_running"),
    "queued": ("sglang:num_queue_reqs", "vllm:num_requests_waiting"),
    "generation_tokens": ("sglang:generation_tokens_total", "vllm:generation_tokens_total"),
    "verify_calls": ("sglang:spec_verify_calls_total", "vllm:spec_decode_num_drafts_total"),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
    "used_tokens": ("sglang:num_used_tokens",),
    "max_tokens": ("sglang:max_total_num_tokens",),
}
_AVERAGED = {
    "accept_length_gauge": ("sglang:spec_accept_length",),
    # an adaptive server's draft depth now (--speculative-adaptive moves it by load)
    "spec_depth": ("sglang:spec_num_steps",),
}
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
    max_running: float | None = None  # from /v1/loads
    used_tokens: float | None = None  # the KV cache's tokens in use
    max_tokens: float | None = None  # and its size (SGLang's ``max_total_num_tokens``)
    spec_depth: float | None = None  # the draft depth in use, SGLang's ``spec_num_steps``
    engine: str | None = None  # "sglang" or "vllm", by the names of its metrics

    @property
    def empty(self) -> bool:
        """No number routing reads: names that were not SGLang's or vLLM's, or no finite
        value."""
        numbers = (
            self.running,
            self.queued,
            self.accept_length_gauge,
            self.generation_tokens,
            self.verify_calls,
            self.accepted_tokens,
        )
        return all(n is None or not math.isfinite(n) for n in numbers)


def parse_loads(answer: object) -> BackendStats | None:
    """Running, queued and capacity, and the KV cache's tokens in use and its size, from
    SGLang's ``GET /v1/loads`` (summed over its data parallel ranks; a field some rank
    does not give is None), or None for an answer not of that shape. Current at the
    request, where the ``/metrics`` gauges are refreshed only at prefill and every few
    dozen decode steps."""
    loads = answer.get("loads") if isinstance(answer, dict) else None
    if not isinstance(loads, list) or not loads or not all(isinstance(r, dict) for r in loads):
        return None

    def total(key: str) -> float | None:
        counts = [_count(rank.get(key)) for rank in loads]
        return None if None in counts else math.fsum(c for c in counts if c is not None)

    running, queued = total("num_running_reqs"), total("num_waiting_reqs")
    if running is None or queued is None:
        return None
    return BackendStats(
        running,
        queued,
        max_running=total("max_running_requests"),
        used_tokens=total("num_used_tokens"),
        max_tokens=total("max_total_num_tokens"),
    )


def with_loads(stats: BackendStats, loads: BackendStats) -> BackendStats:
    """A ``/metrics`` scrape with what ``/v1/loads`` said in place of its gauges: the
    fresher figures, where the loads gave them."""
    return replace(
        stats,
        running=loads.running,
        queued=loads.queued,
        max_running=loads.max_running,
        used_tokens=_first(loads.used_tokens, stats.used_tokens),
        max_tokens=_first(loads.max_tokens, stats.max_tokens),
    )


def _first(*values: float | None) -> float | None:
    return next((v for v in values if v is not None), None)


def _count(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if 0 <= value < math.inf else None


def parse(text: str) -> BackendStats:
    values = prometheus.values(text, _WANTED, keep=lambda labels: not labels.get("priority"))
    found: dict[str, float | None] = {}
    for field, names in _SUMMED.items():
        found[field] = next((math.fsum(values[n]) for n in names if n in values), None)
    for field, names in _AVERAGED.items():
        found[field] = next((statistics.fmean(values[n]) for n in names if n in values), None)
    engine = next((name.split(":")[0] for name in values), None)
    return BackendStats(**found, engine=engine)


def _delta(old: float | None, new: float | None) -> float | None:
    """A counter's growth between two scrapes: a series not yet created counts as 0, and
    a counter that went down (the backend restarted) counts from 0."""
    if new is None:
        return None
    old = old or 0.0
    return new - old if new >= old else new


def window_accept_length(old: BackendStats, new: BackendStats) -> float | None:
    """Tokens per decoding step between two scrapes, over every step: SGLang's generation
    tokens over verify calls (each decode step of a speculative server verifies); vLLM's
    generation tokens over the steps that made them, generation tokens less accepted draft
    tokens (each step of a request makes one token and whatever it accepts). ``1 + accepted
    / drafts`` would count only the steps that had a draft, which n-gram speculation often
    has not (vLLM also counts drafts accepted past ``max_tokens`` that it cuts off: at most
    the draft length more per request, a few percent for short answers). None when nothing
    was decoded (vLLM) or verified (SGLang)."""
    tokens = _delta(old.generation_tokens, new.generation_tokens)
    if tokens is None:
        return None
    accepted = _delta(old.accepted_tokens, new.accepted_tokens)
    if accepted is not None:  # vLLM: a window without a single draft made 1 token a step
        steps = tokens - accepted
        return tokens / steps if steps > 0 else None
    verifies = _delta(old.verify_calls, new.verify_calls)
    return tokens / verifies if verifies is not None and verifies > 0 else None


def gauge_moved(old: BackendStats | None, new: BackendStats) -> bool:
    """Whether the accept-length gauge changed between two scrapes: the engine refreshed
    it."""
    return old is not None and new.accept_length_gauge != old.accept_length_gauge


def live_accept_length(old: BackendStats | None, new: BackendStats) -> float | None:
    """The accept length a scrape tells of, or None when it has no news. SGLang's own gauge
    (``sglang:spec_accept_length``, over its last full decode-log interval of 40 steps)
    when it moved since the last scrape (the first scrape's may be left from traffic long
    gone): the freshest figure, and the only one while long streams decode, since the
    counters move only when a request finishes. Else the counters' window since the last
    scrape, over the requests that finished in it: short requests (a probe) may end before
    the gauge's interval fills, so a gauge that did not move is old news, however busy the
    server. Where there is no gauge (vLLM, or a gauge of 0: a server that does not
    speculate), the window alone."""
    gauge = new.accept_length_gauge
    if gauge_moved(old, new) and gauge is not None and gauge > 0 and math.isfinite(gauge):
        return gauge
    if old is None:
        return None
    window = window_accept_length(old, new)
    return window if window is not None and math.isfinite(window) else None
