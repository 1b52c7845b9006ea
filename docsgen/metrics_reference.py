"""The metrics reference, read from the Prometheus registries themselves: the router's (its
counters and histograms, and the gauges it reads from its state at each scrape) and the
emulated SGLang server's. Each metric with its name as queried, type, help and labels."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

from docsgen.markdown import code, table
from specroute.emulator.metrics import EngineMetrics
from specroute.router.app import create_app
from specroute.router.settings import RouterSettings
from specroute.router.state import STATE

# a profile with everything the router's gauges show: bands, an accept length, a context
_PROFILE = {
    "schema": "specroute.profile/v1",
    "created": "2026-12-01T00:00:00+00:00",
    "crossover": {"value": 5, "ci": [4, 6], "bands": [[None, 5]]},
    "acceptance": {"mean_accept_length": 3.0},
    "workload": {"mean_prompt_tokens": 512, "mean_output_tokens": 128},
}


@dataclass(frozen=True)
class MetricDoc:
    name: str  # as a query names it: a counter's with _total
    kind: str
    help: str
    labels: tuple[str, ...]


def _queried(name: str, kind: str) -> str:
    return f"{name}_total" if kind == "counter" else name


def metric_docs(registry: CollectorRegistry, wrappers: Iterable[object]) -> Iterator[MetricDoc]:
    """Every metric ``registry`` exposes, in its order. A labelled counter shows no sample
    before its first increment, so labels come from the metric objects themselves
    (``wrappers``: prometheus_client's metrics; families collected carry their own)."""
    declared = {
        w._name: w._labelnames
        for w in wrappers
        if isinstance(w, MetricWrapperBase)  # the same name a collection reports
    }
    for family in registry.collect():
        labels = declared.get(family.name) or getattr(family, "_labelnames", ())
        if not labels:
            labels = tuple(dict.fromkeys(k for s in family.samples for k in s.labels))
        yield MetricDoc(
            _queried(family.name, family.type), family.type, family.documentation, tuple(labels)
        )


def router_metrics() -> list[MetricDoc]:
    """A router built as ``specroute serve --profile`` builds it (nothing started), with a
    profile that makes every conditional gauge appear."""
    with tempfile.TemporaryDirectory() as folder:
        profile = Path(folder) / "profile.json"
        profile.write_text(json.dumps(_PROFILE))
        settings = RouterSettings.model_validate(  # the environment left out
            {"spec": ["http://127.0.0.1:1"], "base": ["http://127.0.0.1:2"], "profile": profile}
        )
        metrics = create_app(settings)[STATE].metrics
        return list(metric_docs(metrics.exposed, vars(metrics).values()))


def emulator_metrics() -> list[MetricDoc]:
    metrics = EngineMetrics("model")
    return list(metric_docs(metrics.registry, vars(metrics).values()))


def metrics_table(docs: Iterable[MetricDoc]) -> str:
    rows = [[code(d.name), d.kind, ", ".join(code(x) for x in d.labels), d.help] for d in docs]
    return table(["metric", "type", "labels", "help"], rows)


def metrics_reference(which: str) -> str:
    """``router`` or ``emulator``."""
    found = {"router": router_metrics, "emulator": emulator_metrics}[which]()
    return metrics_table(found)
