"""A sweep turned into the profile: per level and backend, medians with bootstrap
intervals; the crossover of time per output token and of aggregate throughput, each with
its interval, or the bound when speculation won (or lost) at every level measured.

Aggregate throughput of a closed loop is taken by Little's law, ``level x mean output
tokens / mean end-to-end time`` over the measured requests, so it is bootstrapped with
them. Each replicate also carries a small systematic error (``SYSTEMATIC``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np

from specroute.crossing import log_margin
from specroute.policies.profile import SCHEMA
from specroute.profiler.stats import (
    Array,
    Crossing,
    Estimate,
    crossing_with_ci,
    estimate,
    median_replicates,
)
from specroute.profiler.sweep_data import Cell, SweepData, SweepError

BOOTSTRAP = 2000
# A level's median moves by about this much (1 sigma) with what the requests cannot show:
# the load generator's own latency and the server's timer slack. Measured as the spread
# between live runs against the emulator and its virtual-time prediction; added to every
# bootstrap replicate of TPOT and throughput, so crossings of flat curves get honest widths.
SYSTEMATIC = 0.01
_SERVER_KEYS = ("model_path", "version", "tp_size", "dp_size", "max_running_requests",
                "cuda_graph_max_bs", "context_length", "stream_interval", "speculative_algorithm",
                "speculative_draft_model_path", "speculative_num_steps",
                "speculative_eagle_topk", "speculative_num_draft_tokens", "emulator")  # fmt: skip


@dataclass(frozen=True)
class CellStats:
    n: int
    tpot: Estimate  # seconds
    decode_tps: Estimate  # per request
    ttft: Estimate  # seconds
    output_tps: Estimate  # aggregate
    accept_length: float | None
    slo_met: float | None  # fraction of requests within the SLOs
    goodput_rps: float | None
    failures: int
    invalid_runs: int
    tpot_replicates: Array
    output_replicates: Array

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": self.n, "tpot_ms": self.tpot.as_json(1000, 3, exact=True),
            "decode_tps": self.decode_tps.as_json(1, 2), "ttft_ms": self.ttft.as_json(1000, 2),
            "output_tps": self.output_tps.as_json(1, 2, exact=True),
            "accept_length": self.accept_length,
            "slo_met": self.slo_met, "goodput_rps": self.goodput_rps,
            "failures": self.failures, "invalid_runs": self.invalid_runs,
        }  # fmt: skip


@dataclass(frozen=True)
class Analysis:
    data: SweepData
    levels: list[int]
    cells: dict[tuple[str, int], CellStats]
    tpot_crossover: Crossing
    throughput_crossover: Crossing
    slo: dict[str, float]


def _median(samples: Array, rng: np.random.Generator) -> Estimate:
    return estimate(float(np.median(samples)), median_replicates(samples, rng, BOOTSTRAP))


def _cell(level: int, cell: Cell, slo: dict[str, float], rng: np.random.Generator) -> CellStats:
    records = cell.records
    tpot = np.array([r.tpot() for r in records], dtype=float)
    ttft = np.array([r.ttft() for r in records], dtype=float)
    tokens = np.array([r.tokens for r in records], dtype=float)
    e2e = np.array([r.e2e() for r in records], dtype=float)
    idx = rng.integers(0, len(records), size=(BOOTSTRAP, len(records)))
    drift = rng.normal(1.0, SYSTEMATIC, size=(2, BOOTSTRAP))
    tpot_reps = np.median(tpot[idx], axis=1) * drift[0]
    output_reps = level * tokens[idx].mean(axis=1) / e2e[idx].mean(axis=1) * drift[1]
    met = goodput = None
    if slo:
        ok = np.ones(len(records), dtype=bool)
        if "ttft" in slo:
            ok &= ttft <= slo["ttft"]
        if "tpot" in slo:
            ok &= tpot <= slo["tpot"]
        met = float(ok.mean())
        goodput = round(met * level / float(e2e.mean()), 4)
    accepts = cell.accept_lengths
    return CellStats(
        n=len(records),
        tpot=estimate(float(np.median(tpot)), tpot_reps),
        decode_tps=_median(1 / tpot, rng),
        ttft=_median(ttft, rng),
        output_tps=estimate(level * float(tokens.mean() / e2e.mean()), output_reps),
        accept_length=round(float(np.mean(accepts)), 3) if accepts else None,
        slo_met=met, goodput_rps=goodput,
        failures=cell.failures, invalid_runs=cell.invalid_runs,
        tpot_replicates=tpot_reps, output_replicates=output_reps,
    )  # fmt: skip


def analyse(data: SweepData, slo: dict[str, float] | None = None, seed: int = 0) -> Analysis:
    levels = data.levels
    if not levels:
        raise SweepError(f"{data.path}: no level has valid measurements of both backends")
    rng = np.random.default_rng(seed)
    slo = slo or {}
    cells = {
        (backend, level): _cell(level, data.cells[(backend, level)], slo, rng)
        for level in levels
        for backend in ("spec", "base")
        if len(data.cells[(backend, level)].records) >= 2
    }
    levels = [lvl for lvl in levels if ("spec", lvl) in cells and ("base", lvl) in cells]
    if not levels:
        raise SweepError(f"{data.path}: too few requests measured at every level")

    tpot = crossing_with_ci(levels, *_margins(cells, levels, "tpot"))
    output = crossing_with_ci(levels, *_margins(cells, levels, "output"))
    return Analysis(data, levels, cells, tpot, output, slo)


def _margins(
    cells: dict[tuple[str, int], CellStats], levels: list[int], metric: Literal["tpot", "output"]
) -> tuple[list[float], list[list[float]]]:
    """Speculation's margin over the plain server at each level (``log_margin``, positive
    where speculation is better), of the medians and of each bootstrap replicate."""

    def curve(backend: str) -> tuple[list[float], list[list[float]]]:
        row = [cells[(backend, lvl)] for lvl in levels]
        if metric == "tpot":
            points, reps = [c.tpot.value for c in row], [c.tpot_replicates for c in row]
        else:
            points, reps = [c.output_tps.value for c in row], [c.output_replicates for c in row]
        return points, np.stack(reps, axis=1).tolist()

    spec, base = curve("spec"), curve("base")
    ours, theirs = (spec, base) if metric == "tpot" else (base, spec)  # a rate: higher is better
    replicates = [log_margin(o, t) for o, t in zip(ours[1], theirs[1], strict=True)]
    return log_margin(ours[0], theirs[0]), replicates


def _crossover_json(c: Crossing, metric: str) -> dict[str, Any]:
    """The value unrounded: it is the crossing of the curves the profile records, and a
    reader computing it again from them (a policy's threshold) finds the same number."""
    if c.value is None:
        return {"value": None, "ci": None, "bound": c.bound, "limit": c.limit, "metric": metric}
    assert c.low is not None and c.high is not None
    ci = [min(round(c.low, 3), c.value), max(round(c.high, 3), c.value)]
    return {"value": c.value, "ci": ci, "confidence": 0.95, "metric": metric}


def _server(meta: dict[str, Any], backend: str) -> dict[str, Any]:
    info = meta.get(backend, {}).get("server_info") or {}
    return {"url": meta.get(backend, {}).get("url")} | {
        k: info[k] for k in _SERVER_KEYS if k in info
    }


def profile_document(analysis: Analysis) -> dict[str, Any]:
    """The ``specroute.profile/v1`` document for an analysis."""
    data, cells = analysis.data, analysis.cells
    meta = data.meta
    accepts = [a for lvl in analysis.levels if (a := cells[("spec", lvl)].accept_length)]
    records = [r for c in data.cells.values() for r in c.records]
    prompt = [r.prompt_tokens for r in records if r.prompt_tokens is not None]
    return {
        "schema": SCHEMA,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "crossover": _crossover_json(analysis.tpot_crossover, "tpot"),
        "throughput_crossover": _crossover_json(analysis.throughput_crossover, "output_tps"),
        "levels": [
            {"concurrency": lvl, "spec": cells[("spec", lvl)].as_json(),
             "base": cells[("base", lvl)].as_json()}
            for lvl in analysis.levels
        ],
        "acceptance": {
            "mean_accept_length": round(float(np.mean(accepts)), 3) if accepts else None,
            "by_level": {str(lvl): cells[("spec", lvl)].accept_length for lvl in analysis.levels},
            "source": "counter deltas over each measurement window",
        },
        "servers": {"spec": _server(meta, "spec"), "base": _server(meta, "base")},
        "workload": (meta.get("dataset") or {}) | {
            "mean_prompt_tokens": round(float(np.mean(prompt)), 1) if prompt else None,
            "mean_output_tokens": round(float(np.mean([r.tokens for r in records])), 1),
            "ignore_eos": meta.get("settings", {}).get("ignore_eos"),
        },
        "measurement": {
            "sweep": str(data.path), "model": meta.get("model"),
            "started": meta.get("started"), "ended": meta.get("ended"),
            "repeats": meta.get("settings", {}).get("repeats"),
            "backend_seconds": meta.get("backend_seconds"),
            "bootstrap_replicates": BOOTSTRAP, "slo": analysis.slo or None,
            "fairness_warnings": meta.get("fairness_warnings", []),
        },
    }  # fmt: skip
