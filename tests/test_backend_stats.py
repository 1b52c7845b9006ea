"""The pure metrics parser on scrapes of real engines' exposition text."""

from __future__ import annotations

from pathlib import Path

import pytest

from specroute.router.backend_stats import BackendStats, parse, window_accept_length

DATA = Path(__file__).parent / "data"


def test_sglang_sums_ranks_skips_priority_repeats_and_averages_accept_length() -> None:
    stats = parse((DATA / "sglang-metrics.txt").read_text())
    assert stats.running == 21  # 12 + 9; the per-priority series repeat the totals
    assert stats.queued == 3
    assert stats.accept_length_gauge == pytest.approx(3.0)  # the ranks' mean, not their sum
    assert stats.generation_tokens == 1234567
    assert stats.verify_calls == 411522
    assert stats.accepted_tokens is None


def test_missing_numbers_are_none_and_junk_is_ignored() -> None:
    text = '# HELP x\nsglang:num_running_reqs{a="b}"} 4\nsglang:num_queue_reqs NaNx\nfoo 1\n'
    assert parse(text) == BackendStats(running=4.0)
    assert parse("") == BackendStats()


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("sglang_a", "sglang_b", 3.5),  # (1700 - 1000) / (500 - 300); the gauge says 2
        ("sglang_a", "sglang_a", None),  # no verify in the window
        ("vllm_a", "vllm_b", 1 + 60 / 40),
        ("empty", "sglang_a", 1000 / 300),  # counters not yet created count as 0
        ("sglang_b", "sglang_a", 1000 / 300),  # a restarted backend counts from 0
    ],
)
def test_window_accept_length_comes_from_counter_deltas(
    old: str, new: str, expected: float | None
) -> None:
    snapshots = {
        "empty": BackendStats(),
        "sglang_a": BackendStats(generation_tokens=1000, verify_calls=300, accept_length_gauge=2),
        "sglang_b": BackendStats(generation_tokens=1700, verify_calls=500, accept_length_gauge=2),
        "vllm_a": BackendStats(generation_tokens=10, verify_calls=10, accepted_tokens=5),
        "vllm_b": BackendStats(generation_tokens=90, verify_calls=50, accepted_tokens=65),
    }
    assert window_accept_length(snapshots[old], snapshots[new]) == expected


def test_vllm_capture_and_its_window_accept_length() -> None:
    busy = parse((DATA / "vllm-metrics-busy.txt").read_text())
    after = parse((DATA / "vllm-metrics-after.txt").read_text())
    assert (busy.running, busy.queued) == (8, 0)
    assert (after.running, after.generation_tokens, after.verify_calls) == (0, 4800, 1186)
    assert after.accept_length_gauge is None  # vLLM has no such gauge
    # 1 + accepted / drafts between the two scrapes: (3053 - 959) / (1186 - 363)
    assert window_accept_length(busy, after) == pytest.approx(1 + 2094 / 823)
