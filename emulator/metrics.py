"""Prometheus metrics under SGLang's names, plus the emulator's own lag."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar, cast

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_Metric = TypeVar("_Metric", Counter, Gauge, Histogram)

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (*TTFT_BUCKETS, 600, 1200, 1800, 2400)
ITL_BUCKETS = (
    0.002,
    0.004,
    0.006,
    0.008,
    0.010,
    0.015,
    0.020,
    0.025,
    0.030,
    0.035,
    0.040,
    0.060,
    0.080,
    0.100,
    0.200,
    0.400,
    0.600,
    0.800,
    1.0,
    2.0,
    4.0,
    6.0,
    8.0,
)


class EngineMetrics:
    """One registry per emulated server, so several can share a process (tests do)."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        self.scheduler_labels = {
            "model_name": model_name,
            "engine_type": "unified",
            "tp_rank": "0",
            "pp_rank": "0",
        }
        self.scheduler_values = tuple(self.scheduler_labels.values())
        self.model_name = model_name
        self._bound: dict[tuple[object, tuple[str, ...]], object] = {}
        self._values = {s: tuple(self.tokenizer(s).values()) for s in (None, True, False)}
        self._scheduler_gauges()
        self._tokenizer_metrics()
        self._emulator_metrics()

    def _scheduler_gauges(self) -> None:
        """SGLang's scheduler gauges, labelled as its scheduler labels them."""
        names = list(self.scheduler_labels)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(
                f"sglang:{name}", doc, names, registry=self.registry, multiprocess_mode="mostrecent"
            )

        self.num_running_reqs = gauge("num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = gauge(
            "num_queue_reqs", "The number of requests in the waiting queue."
        )
        self.gen_throughput = gauge("gen_throughput", "The generation throughput (token/s).")
        self.token_usage = gauge("token_usage", "The token usage.")
        self.num_used_tokens = gauge("num_used_tokens", "Tokens held in the KV cache.")
        self.max_total_num_tokens = gauge(
            "max_total_num_tokens", "The KV cache's size in tokens (set once, at start)."
        )
        self.spec_accept_length = gauge(
            "spec_accept_length", "The average acceptance length of speculative decoding."
        )
        self.spec_accept_rate = gauge(
            "spec_accept_rate", "The average acceptance rate of speculative decoding."
        )
        self.spec_num_steps = gauge("spec_num_steps", "Currently active speculative_num_steps.")
        self.spec_num_draft_tokens = gauge(
            "spec_num_draft_tokens", "Currently active speculative_num_draft_tokens."
        )
        self.cache_hit_rate = gauge("cache_hit_rate", "The prefix cache hit rate.")
        self.num_retracted_reqs = gauge("num_retracted_reqs", "The number of retracted requests.")
        self.num_retracted_requests = Counter(
            "sglang:num_retracted_requests",
            "Total number of retracted requests.",
            names,
            registry=self.registry,
        )
        self.num_retracted_input_tokens = Counter(
            "sglang:num_retracted_input_tokens",
            "Total number of retracted input tokens.",
            names,
            registry=self.registry,
        )
        self.prefill_effective_tokens = Counter(
            "sglang:prefill_effective_tokens",
            "Effective prefill tokens with retracted-request re-counts excluded, updated on "
            "each log interval. mode: device_hit, host_hit, storage_hit, input.",
            [*names, "mode"],
            registry=self.registry,
        )

    def _tokenizer_metrics(self) -> None:
        """SGLang's tokenizer-side counters and histograms; ``streaming`` ones also by
        whether the request streamed."""
        tokenizer = ["model_name", "engine_type"]
        streaming = [*tokenizer, "is_streaming"]
        counter, histogram = self._counter, self._histogram
        self.prompt_tokens = counter(
            "sglang:prompt_tokens", "Number of prefill tokens processed.", streaming
        )
        self.generation_tokens = counter(
            "sglang:generation_tokens", "Number of generation tokens processed.", streaming
        )
        self.num_requests = counter(
            "sglang:num_requests", "Number of requests processed.", streaming
        )
        self.num_aborted_requests = counter(
            "sglang:num_aborted_requests", "Number of requests aborted.", tokenizer
        )
        self.cached_tokens = counter(
            "sglang:cached_tokens",
            "Number of cached prompt tokens by source (device/host/storage).",
            [*tokenizer, "cache_source"],
        )
        self.spec_verify_calls = counter(
            "sglang:spec_verify_calls", "Number of speculative verify calls.", tokenizer
        )
        self.ttft = histogram(
            "sglang:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            streaming,
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "sglang:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            tokenizer,
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "sglang:e2e_request_latency_seconds",
            "Histogram of End-to-end request latency in seconds",
            streaming,
            E2E_BUCKETS,
        )

    def _emulator_metrics(self) -> None:
        """The emulator's own: how far the machine keeps up with the model, steps, faults."""
        counter = self._counter
        self.step_intended = counter(
            "specroute_emulator_step_intended_seconds",
            "Wall time the engine model asked for (step time x time scale, and any wait "
            "for GPUs shared with other servers).",
        )
        self.step_actual = counter(
            "specroute_emulator_step_actual_seconds",
            "Wall time the steps really took, delivery included.",
        )
        self.lag_ratio = Gauge(
            "specroute_emulator_lag_ratio",
            "Actual over intended step time, minus one, over the recent steps: "
            "above 0.05 the machine, not the model, sets the pace.",
            registry=self.registry,
        )
        self.steps = counter("specroute_emulator_steps", "Engine steps run, by kind.", ["kind"])
        self.faults = counter(
            "specroute_emulator_faults",
            "Faults injected, by kind (see /emulator/faults); slow counts the generation "
            "requests that arrived while it was in force.",
            ["kind"],
        )

    def _counter(self, name: str, doc: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def _histogram(
        self, name: str, doc: str, labels: Sequence[str], buckets: Sequence[float]
    ) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def bound(self, metric: _Metric, *values: str) -> _Metric:
        """``metric``'s child for the label ``values`` (in the order of its labels), made
        at its first use, as ``labels()`` makes it, and kept: ``labels()`` itself takes a
        lock and checks every name, and the emulator counts at every token."""
        key = (metric, values)
        child = self._bound.get(key)
        if child is None:
            child = self._bound[key] = metric.labels(*values)
        return cast(_Metric, child)

    def tokenizer_values(self, streaming: bool | None = None) -> tuple[str, ...]:
        """``tokenizer``'s values, in the order of the labels."""
        return self._values[streaming]

    def tokenizer(self, streaming: bool | None = None) -> dict[str, str]:
        labels = {"model_name": self.model_name, "engine_type": "unified"}
        if streaming is not None:
            labels["is_streaming"] = str(streaming).lower()
        return labels
