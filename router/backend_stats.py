"""A pure parser of a backend's Prometheus text into the numbers routing needs.

Understands SGLang (``sglang:``) and vLLM (``vllm:``) names; sums over label sets (one
engine may report per rank). Counters are kept raw: the poller takes deltas between two
snapshots for a window's accept length, never the cumulative average.
"""

from __future__ import annotations

from dataclasses import dataclass

_GAUGES = {
    "running": ("sglang:num_running_reqs", "vllm:num_requests_running"),
    "queued": ("sglang:num_queue_reqs", "vllm:num_requests_waiting"),
    "accept_length_gauge": ("sglang:spec_accept_length",),
}
_COUNTERS = {
    "generation_tokens": ("sglang:generation_tokens_total", "vllm:generation_tokens_total"),
    "verify_calls": ("sglang:spec_verify_calls_total", "vllm:spec_decode_num_drafts_total"),
    "accepted_tokens": ("vllm:spec_decode_num_accepted_tokens_total",),
}


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
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        brace = line.find("{")
        if brace >= 0:
            name, rest = line[:brace], line[line.rfind("}") + 1 :]
        else:
            name, _, rest = line.partition(" ")
        parts = rest.split()
        try:
            value = float(parts[0])
        except (ValueError, IndexError):
            continue
        sums[name] = sums.get(name, 0.0) + value
    found: dict[str, float | None] = {}
    for field, names in (_GAUGES | _COUNTERS).items():
        found[field] = next((sums[n] for n in names if n in sums), None)
    return BackendStats(**found)


def window_accept_length(old: BackendStats, new: BackendStats) -> float | None:
    """Tokens per verify step between two scrapes (SGLang: generation tokens over verify
    calls; vLLM: 1 + accepted over drafts); None when nothing was verified."""
    if new.verify_calls is None or old.verify_calls is None:
        return None
    verifies = new.verify_calls - old.verify_calls
    if verifies <= 0:
        return None
    if new.accepted_tokens is not None and old.accepted_tokens is not None:
        return 1.0 + (new.accepted_tokens - old.accepted_tokens) / verifies
    if new.generation_tokens is None or old.generation_tokens is None:
        return None
    return (new.generation_tokens - old.generation_tokens) / verifies
