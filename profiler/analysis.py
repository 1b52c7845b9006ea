"""A sweep turned into the profile: per level and backend, medians with bootstrap
intervals; the crossover of time per output token and of aggregate throughput, each with
its interval, or the bound when speculation won (or lost) at every level measured.

Aggregate throughput of a closed loop is taken by Little's law, ``level x mean output
tokens / mean end-to-end time`` over the measured requests, so it is bootstrapped with
them. Bootstrap replicates resample requests within each run and shift by the spread of the
runs' own values (``stats``): the spread between runs is measured, not assumed, so no fixed
systematic term is added.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np

from specroute.crossing import log_margin
from specroute.loadgen.record import RequestRecord
from specroute.policies.profile import SCHEMA, SCHEMA_V2
from specroute.profiler.stats import (
    Array,
    Crossing,
    Estimate,
    between_runs,
    crossing_with_ci,
    estimate,
    resampled,
    run_draws,
    within_runs,
)
from specroute.profiler.sweep_data import Cell, SweepData, SweepError

BOOTSTRAP = 2000
_SERVER_KEYS = (
    "model_path",
    "version",
    "tp_size",
    "dp_size",
    "max_running_requests",
    "cuda_graph_max_bs",
    "context_length",
    "stream_interval",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_adaptive",  # SGLang 0.5.23's own switching of its depth by batch
    "speculative_adaptive_config",  # its schedule's file; None: SGLang's default
    "async_scheduling",
    "engine",
    "emulator",
)


@dataclass(frozen=True)
class CellStats:
    n: int
    runs: int  # valid runs the requests came from: the bootstrap's unit
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
            "requests": self.n,
            "runs": self.runs,
            "tpot_ms": self.tpot.as_json(1000, 3, exact=True),
            "decode_tps": self.decode_tps.as_json(1, 2),
            "ttft_ms": self.ttft.as_json(1000, 2),
            "output_tps": self.output_tps.as_json(1, 2, exact=True),
            "accept_length": self.accept_length,
            "slo_met": self.slo_met,
            "goodput_rps": self.goodput_rps,
            "failures": self.failures,
            "invalid_runs": self.invalid_runs,
        }


@dataclass(frozen=True)
class Analysis:
    data: SweepData
    levels: list[int]
    cells: dict[tuple[str, int], CellStats]
    tpot_crossover: Crossing
    throughput_crossover: Crossing
    slo: dict[str, float]
    tpot_margin: list[float]  # speculation's margin at each level (``log_margin`` of medians)


def _cell(level: int, cell: Cell, slo: dict[str, float], rng: np.random.Generator) -> CellStats:
    records = sorted(cell.records, key=lambda r: r.repeat)  # one run after another
    runs = [sum(1 for _ in group) for _, group in itertools.groupby(records, lambda r: r.repeat)]
    tpot = np.array([r.tpot() for r in records], dtype=float)
    ttft = np.array([r.ttft() for r in records], dtype=float)
    tokens = np.array([r.tokens for r in records], dtype=float)
    e2e = np.array([r.e2e() for r in records], dtype=float)
    draws = within_runs(runs, rng, BOOTSTRAP)
    t = run_draws(len(runs), rng, BOOTSTRAP)
    bounds = np.cumsum([0, *runs])
    per_run = [slice(a, b) for a, b in itertools.pairwise(bounds)]

    def median_replicates(samples: Array) -> Array:
        run_medians = np.array([np.median(samples[r]) for r in per_run])
        return resampled(samples, draws, np.median) * between_runs(run_medians, t)

    run_output = np.array([tokens[r].mean() / e2e[r].mean() for r in per_run])
    output_reps = (
        level
        * resampled(tokens, draws, np.mean)
        / resampled(e2e, draws, np.mean)
        * between_runs(run_output, t)
    )
    tpot_reps = median_replicates(tpot)

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
        runs=len(runs),
        tpot=estimate(float(np.median(tpot)), tpot_reps),
        decode_tps=estimate(float(np.median(1 / tpot)), median_replicates(1 / tpot)),
        ttft=estimate(float(np.median(ttft)), median_replicates(ttft)),
        output_tps=estimate(level * float(tokens.mean() / e2e.mean()), output_reps),
        accept_length=round(float(np.mean(accepts)), 3) if accepts else None,
        slo_met=met,
        goodput_rps=goodput,
        failures=cell.failures,
        invalid_runs=cell.invalid_runs,
        tpot_replicates=tpot_reps,
        output_replicates=output_reps,
    )


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

    margin, replicates = _margins(cells, levels, "tpot")
    tpot = crossing_with_ci(levels, margin, replicates)
    output = crossing_with_ci(levels, *_margins(cells, levels, "output"))
    return Analysis(data, levels, cells, tpot, output, slo, margin)


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


RULE = (
    "the router speculates inside the bands, the spans of load where the margin was "
    "positive, each edge a crossing; value is the first crossing going up in load where "
    "speculation stops paying (its margin falls from positive to zero or below), so a "
    "single crossover is the one band up to it"
)


def _crossover_json(c: Crossing, metric: str) -> dict[str, Any]:
    """The value unrounded: it is the crossing of the curves the profile records, and a
    reader computing it again from them (a policy's threshold) finds the same number.
    An open end of the interval is null, and ``ci_open`` says which."""
    turns = [
        {
            "at": round(t.at, 3),
            "direction": t.direction,
            "ci": [round(t.low, 3), round(t.high, 3)],
            "support": round(t.support, 4),
        }
        for t in c.turns
    ]
    paying = [list(band) for band in c.bands]  # unrounded, as the value
    beyond = {"below": round(c.beyond[0], 4), "above": round(c.beyond[1], 4)}
    common = {
        "metric": metric,
        "crossings": turns,
        "bands": paying,
        "rule": RULE,
        "replicates_without_crossing": beyond,
    }
    if c.value is None:
        return {"value": None, "ci": None, "bound": c.bound, "limit": c.limit} | common
    ci = [None if c.low is None else round(c.low, 3), None if c.high is None else round(c.high, 3)]
    found: dict[str, Any] = {"value": c.value, "ci": ci, "confidence": 0.95}
    if c.open_side is not None:
        found["ci_open"] = c.open_side
    return found | common


def _server(meta: dict[str, Any], backend: str) -> dict[str, Any]:
    info = meta.get(backend, {}).get("server_info") or {}
    return {"url": meta.get(backend, {}).get("url")} | {
        k: info[k] for k in _SERVER_KEYS if k in info
    }


def profile_document(analysis: Analysis, buckets: Sequence[Analysis] = ()) -> dict[str, Any]:
    """The ``specroute.profile/v1`` document for an analysis. With ``buckets``, one
    analysis per context (``analysis`` the first, the shortest), ``v2``: the first's
    document with the crossover per bucket (``context``) and the backend time of all."""
    document = _document(analysis)
    if len(buckets) < 2:
        return document
    document["schema"] = SCHEMA_V2
    document["context"] = {
        "tokens_per_byte": tokens_per_byte([b.data for b in buckets]),
        "buckets": [_bucket(b) for b in buckets],
    }
    document["measurement"] |= {
        "sweep": str(buckets[0].data.path.parent),  # each bucket's in its own folder
        "backend_seconds": sum(b.data.meta.get("backend_seconds") or 0.0 for b in buckets),
    }
    return document


def _records(data: SweepData) -> list[RequestRecord]:
    return [r for c in data.cells.values() for r in c.records]


def tokens_per_byte(sweeps: Sequence[SweepData]) -> float:
    """Prompt tokens the servers counted per UTF-8 byte of the prompts' text, over every
    measured request that has both."""
    pairs = [
        (r.prompt_tokens, r.prompt_bytes)
        for d in sweeps
        for r in _records(d)
        if r.prompt_tokens and r.prompt_bytes
    ]
    if not pairs:
        raise SweepError(
            "no request recorded both its prompt tokens and bytes: the sweep predates the "
            "context axis, or the servers did not report usage"
        )
    return sum(t for t, _ in pairs) / sum(b for _, b in pairs)


def _bucket(analysis: Analysis) -> dict[str, Any]:
    """One context bucket: its context (the mean KV tokens per request while it decodes:
    its prompt and half its answer), crossovers, levels, each backend's median time per
    output token at each level (``tpot_ms``, what ``expected-latency`` reads at a context)
    and sweep."""
    records = _records(analysis.data)
    prompts = [r.prompt_tokens for r in records if r.prompt_tokens]
    if not prompts:
        raise SweepError(f"{analysis.data.path}: the servers reported no prompt tokens")
    prompt, output = float(np.mean(prompts)), float(np.mean([r.tokens for r in records]))
    return {
        "context": round(prompt + output / 2, 1),
        "crossover": _crossover_json(analysis.tpot_crossover, "tpot"),
        "throughput_crossover": _crossover_json(analysis.throughput_crossover, "output_tps"),
        "levels": analysis.levels,
        "tpot_ms": {
            backend: [
                analysis.cells[(backend, lvl)].as_json()["tpot_ms"]["median"]
                for lvl in analysis.levels
            ]
            for backend in ("spec", "base")
        },
        "workload": {
            "mean_prompt_tokens": round(prompt, 1),
            "mean_output_tokens": round(output, 1),
        },
        "sweep": str(analysis.data.path),
        "backend_seconds": analysis.data.meta.get("backend_seconds"),
    }


def _document(analysis: Analysis) -> dict[str, Any]:
    data, cells = analysis.data, analysis.cells
    meta = data.meta
    accepts = [a for lvl in analysis.levels if (a := cells[("spec", lvl)].accept_length)]
    records = _records(data)
    prompt = [r.prompt_tokens for r in records if r.prompt_tokens is not None]
    return {
        "schema": SCHEMA,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "crossover": _crossover_json(analysis.tpot_crossover, "tpot"),
        "throughput_crossover": _crossover_json(analysis.throughput_crossover, "output_tps"),
        "levels": [
            {
                "concurrency": lvl,
                "spec": cells[("spec", lvl)].as_json(),
                "base": cells[("base", lvl)].as_json(),
            }
            for lvl in analysis.levels
        ],
        "acceptance": {
            "mean_accept_length": round(float(np.mean(accepts)), 3) if accepts else None,
            "by_level": {str(lvl): cells[("spec", lvl)].accept_length for lvl in analysis.levels},
            "source": "counter deltas over each measurement window",
            "definition": "tokens per decoding step, over every step: SGLang's generation "
            "tokens / verify calls; vLLM's generation tokens / (generation tokens - accepted "
            "draft tokens)",
        },
        "servers": {"spec": _server(meta, "spec"), "base": _server(meta, "base")},
        "workload": (meta.get("dataset") or {})
        | {
            "mean_prompt_tokens": round(float(np.mean(prompt)), 1) if prompt else None,
            "mean_output_tokens": round(float(np.mean([r.tokens for r in records])), 1),
            "ignore_eos": meta.get("settings", {}).get("ignore_eos"),
        },
        "measurement": {
            "sweep": str(data.path),
            "model": meta.get("model"),
            "started": meta.get("started"),
            "ended": meta.get("ended"),
            "backend_seconds": meta.get("backend_seconds"),
            "bootstrap_replicates": BOOTSTRAP,
            "slo": analysis.slo or None,
            "fairness_warnings": meta.get("fairness_warnings", []),
        },
    }
