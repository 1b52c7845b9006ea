"""The shipped Azure LLM inference trace 2023 (conversation half), read as its README
describes it, and the window and rate a replay takes of it."""

from __future__ import annotations

import gzip
import statistics
from pathlib import Path

import pytest

from specroute.loadgen.request_trace import (
    RequestTraceError,
    azure_conversations,
    load_azure,
    parse_azure,
    shaped,
)
from specroute.loadgen.trace import diurnal

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data" / "traces"


def test_the_shipped_trace_is_the_one_its_readme_describes() -> None:
    trace = azure_conversations()
    assert len(trace.requests) == 19366
    assert 3400 < trace.seconds < 3600 and trace.rate == pytest.approx(5.5, abs=0.1)
    assert statistics.median(r.prompt_tokens for r in trace.requests) == 1020
    assert statistics.median(r.output_tokens for r in trace.requests) == 129
    assert trace.requests[0].at == 0.0
    assert all(a.at <= b.at for a, b in zip(trace.requests, trace.requests[1:], strict=False))


@pytest.mark.skipif(not SHARED.exists(), reason="no shared/ beside the checkout")
def test_the_copy_is_the_original() -> None:
    original = SHARED / "azure-llm-2023-conv.csv"
    shipped = (
        Path(__file__).resolve().parents[2] / "loadgen" / "traces" / "azure-llm-2023-conv.csv.gz"
    )
    assert gzip.decompress(shipped.read_bytes()) == original.read_bytes()
    assert load_azure(original).requests == azure_conversations().requests


def test_a_window_and_a_rate_keep_the_requests_and_their_bursts() -> None:
    trace = azure_conversations()
    window = trace.window(600, 300)
    inside = [r for r in trace.requests if 600 <= r.at < 900]
    assert len(window.requests) == len(inside) and window.requests[0].at >= 0
    assert [r.prompt_tokens for r in window.requests] == [r.prompt_tokens for r in inside]
    faster = window.scaled(4)
    assert faster.rate == pytest.approx(window.rate * 4, rel=1e-6)
    gaps = [b.at - a.at for a, b in zip(window.requests, window.requests[1:], strict=False)]
    fast_gaps = [b.at - a.at for a, b in zip(faster.requests, faster.requests[1:], strict=False)]
    assert fast_gaps == pytest.approx([g / 4 for g in gaps])
    assert "window 600+300 s, rate x4" in faster.source
    with pytest.raises(RequestTraceError, match="no request"):
        trace.window(10**6, 10)


@pytest.mark.parametrize(
    "text",
    [
        "a,b,c\n1,2,3\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,2\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,0,2\n",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n",
    ],
)
def test_a_file_that_is_not_such_a_trace_is_refused_saying_why(text: str) -> None:
    with pytest.raises(RequestTraceError):
        parse_azure(text, "bad")


@pytest.mark.parametrize("shape", ["ramp", "day"])
def test_a_shaped_trace_sends_the_window_s_requests_at_its_phases_rates(shape: str) -> None:
    """A ramp or a day: the window's lengths in their order, Poisson arrivals at a rate per
    phase (a sixteenth of the peak to the peak and back; a day's hours), the busiest at the
    window's mean rate, the phases as long as the window; scaled, its peak goes with it."""
    window = azure_conversations().window(600, 600)
    trace = shaped(shape, window, seed=3)
    relative = (
        [2.0**-k for k in (4, 3, 2, 1, 0, 1, 2, 3, 4)]
        if shape == "ramp"
        else [diurnal(h) for h in range(24)]
    )
    phase = window.seconds / len(relative)
    counts = [0] * len(relative)
    for r in trace.requests:
        counts[min(int(r.at // phase), len(relative) - 1)] += 1
    for count, share in zip(counts, relative, strict=True):
        expected = window.rate * share * phase
        assert abs(count - expected) < 5 * expected**0.5 + 3, (counts, shape)
    sizes = [(r.prompt_tokens, r.output_tokens) for r in trace.requests]
    assert sizes == [(r.prompt_tokens, r.output_tokens) for r in window.requests][: len(sizes)]
    assert trace.peak_rate == window.rate > trace.rate
    assert trace.scaled(2.5).peak_rate == pytest.approx(2.5 * window.rate)
    assert window.peak_rate == window.rate  # a trace as it came: its mean
