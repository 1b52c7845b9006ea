"""The Prometheus text reader, and the backend-metrics parser on it, on scrapes of real
engines' exposition text and on lines made to be awkward."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specroute import prometheus
from specroute.server_metrics import (
    BackendStats,
    gauge_moved,
    live_accept_length,
    parse,
    window_accept_length,
)

DATA = Path(__file__).parents[1] / "data"


def test_sglang_sums_ranks_skips_priority_repeats_and_averages_accept_length() -> None:
    stats = parse((DATA / "sglang-metrics.txt").read_text())
    assert stats.running == 21  # 12 + 9; the per-priority series repeat the totals
    assert stats.queued == 3
    assert stats.accept_length_gauge == pytest.approx(3.0)  # the ranks' mean, not their sum
    assert stats.generation_tokens == 1234567
    assert stats.verify_calls == 411522
    assert stats.accepted_tokens is None
    assert stats.engine == "sglang"


def test_missing_numbers_are_none_and_junk_is_ignored() -> None:
    text = '# HELP x\nsglang:num_running_reqs{a="b}"} 4\nsglang:num_queue_reqs NaNx\nfoo 1\n'
    assert parse(text) == BackendStats(running=4.0, engine="sglang")
    assert parse("") == BackendStats()


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        ("sglang_a", "sglang_b", 3.5),  # (1700 - 1000) / (500 - 300); the gauge says 2
        ("sglang_a", "sglang_a", None),  # no verify in the window
        ("vllm_a", "vllm_b", 80 / (80 - 60)),  # tokens over the steps that made them
        ("vllm_a", "vllm_c", 1.0),  # no step had a draft: one token a step, not "no news"
        ("vllm_a", "vllm_a", None),  # nothing decoded
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
        "vllm_c": BackendStats(generation_tokens=30, verify_calls=10, accepted_tokens=5),
    }
    assert window_accept_length(snapshots[old], snapshots[new]) == expected


def test_vllm_capture_and_its_window_accept_length() -> None:
    busy = parse((DATA / "vllm-metrics-busy.txt").read_text())
    after = parse((DATA / "vllm-metrics-after.txt").read_text())
    assert (busy.running, busy.queued) == (8, 0)
    assert (after.running, after.generation_tokens, after.verify_calls) == (0, 4800, 1186)
    assert after.accept_length_gauge is None  # vLLM has no such gauge
    assert after.engine == "vllm"  # so a client that leaves is not aborted by rid there
    # tokens over steps between the two scrapes: 3151 tokens, of which 2094 accepted drafts,
    # in 1057 steps; 1 + accepted / drafts would say 1 + 2094 / 823, counting only the steps
    # that had a draft
    assert window_accept_length(busy, after) == pytest.approx((4800 - 1649) / (3151 - 2094))


def test_timestamps_escaped_labels_and_exemplars_are_read_as_prometheus_means_them() -> None:
    text = (
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{model_name="a \\"quoted\\" } name",dp="0"} 5 1712345678000\n'
        'sglang:num_running_reqs{model_name="b\\\\c\\nd",dp="1"} 2.5e0 1712345678000\n'
        'sglang:num_running_reqs{priority="1"} 7 1712345678000\n'
        'sglang:generation_tokens_total{x="y"} 100 # {trace_id="t"} 9.0 1712345678.1\n'
    )
    stats = parse(text)
    assert stats.running == 7.5  # 5 + 2.5: neither timestamp is the value, priority skipped
    assert stats.generation_tokens == 100  # the exemplar's 9.0 is not the sample's value
    labels = [s.labels for s in prometheus.samples(text, {"sglang:num_running_reqs"})]
    assert labels[0] == {"model_name": 'a "quoted" } name', "dp": "0"}
    assert labels[1] == {"model_name": "b\\c\nd", "dp": "1"}


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("m NaN", math.nan),
        ("m +Inf", math.inf),
        ('m{a="b",} -Inf 1712345678', -math.inf),
        ('  m { a = "b" } 3', 3.0),
        ("m 1 2 3", None),  # one value and one timestamp, no more
        ('m{a="b" 1', None),
        ("# m 4", None),
    ],
)
def test_the_reader_on_single_lines(line: str, value: float | None) -> None:
    found = [s.value for s in prometheus.samples(line)]
    if value is None:
        assert found == []
    elif math.isnan(value):
        assert len(found) == 1 and math.isnan(found[0])
    else:
        assert found == [value]


def test_the_reader_agrees_with_prometheus_client_on_the_vllm_capture() -> None:
    text = (DATA / "vllm-metrics-busy.txt").read_text()
    theirs = [
        (s.name, s.labels, s.value) for f in text_string_to_metric_families(text) for s in f.samples
    ]
    ours = [(s.name, dict(s.labels), s.value) for s in prometheus.samples(text)]
    assert ours == theirs


_SPEC = BackendStats(generation_tokens=1000, verify_calls=300, accept_length_gauge=2.5)


def _spec(**changes: Any) -> BackendStats:
    return replace(_SPEC, **changes)


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        (_SPEC, _spec(accept_length_gauge=2.8), 2.8),
        (_SPEC, _SPEC, None),  # nothing moved, nothing decoding: no news
        (_SPEC, _spec(running=3), None),
        (_SPEC, _spec(generation_tokens=1300, verify_calls=400), 3.0),
        (
            _SPEC,
            _spec(generation_tokens=1300, verify_calls=400, accept_length_gauge=2.8),
            2.8,
        ),
        (
            _SPEC,
            _spec(generation_tokens=1350, verify_calls=400, accept_length_gauge=0.0),
            3.5,
        ),
        (
            _SPEC,
            _spec(generation_tokens=1700, verify_calls=500, accept_length_gauge=math.nan),
            3.5,
        ),
        (None, _SPEC, None),  # the first scrape: a gauge that may be an old run's
        (_SPEC, _spec(running=3, generation_tokens=1350, verify_calls=400), 3.5),
        (None, BackendStats(generation_tokens=10, verify_calls=3), None),
    ],
    ids=[
        "gauge moved",
        "no news",
        "decoding, gauge still: old news",
        "gauge still, requests finished: the counters",
        "both moved: the gauge, fresher",
        "gauge of 0: the counters",
        "gauge not a number: the counters",
        "first scrape",
        "gauge still, decoding, requests finished: the counters",
        "counters, first scrape",
    ],
)
def test_the_live_accept_length_is_the_engines_gauge_when_it_moves(
    old: BackendStats | None, new: BackendStats, expected: float | None
) -> None:
    assert live_accept_length(old, new) == expected


def test_a_gauge_moved_when_its_value_changed() -> None:
    assert not gauge_moved(None, _SPEC)
    assert not gauge_moved(_SPEC, _spec(running=2))
    assert gauge_moved(_SPEC, _spec(accept_length_gauge=2.4))
    assert gauge_moved(BackendStats(), _SPEC)  # a first sample after none


@pytest.mark.parametrize(
    ("text", "empty"),
    [
        ("<html>maintenance</html>", True),
        ("sglang:num_running_reqs NaN\nsglang:num_queue_reqs +Inf\n", True),
        ("foo_total 3\n", True),
        ("sglang:num_queue_reqs 0\n", False),
        ((DATA / "sglang-metrics.txt").read_text(), False),
    ],
    ids=["not metrics", "no finite value", "another engine's", "one zero", "SGLang's"],
)
def test_a_scrape_without_a_number_is_empty(text: str, empty: bool) -> None:
    assert parse(text).empty is empty
