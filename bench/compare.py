"""``specroute bench compare``: the same time-varying load through the router with each
policy in turn, against the same backends, summarised per phase and overall.

The router runs as its own process (``specroute serve --config FILE --policy NAME``), as a
user runs it; the backends stay up throughout, so every policy meets the same servers.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from bench.client import request_body
from bench.dataset import Dataset
from bench.record import RequestRecord, tokens_between
from bench.spawn import spawned
from bench.trace import Trace
from bench.trace_loop import play

BASELINES = ("always-spec", "always-base")


@dataclass(frozen=True)
class ComparePlan:
    router_config: Path
    trace: Trace
    dataset: Dataset
    policies: tuple[str, ...] = ("crossover", *BASELINES)
    slo: dict[str, float] = field(default_factory=dict)
    ignore_eos: bool = True


def _pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def summarise(
    records: list[RequestRecord], start: float, end: float, slo: dict[str, float]
) -> dict[str, Any]:
    """One policy over one span: latency percentiles, throughput, goodput, spec share."""
    done = [r for r in records if r.ok]
    tpot = [t for r in done if (t := r.tpot()) is not None]
    ttft = [t for r in done if (t := r.ttft()) is not None]
    tokens = tokens_between(records, start, end)
    good = [r for r in done if (r.ttft() or 0) <= slo.get("ttft", float("inf"))
            and (r.tpot() or 0) <= slo.get("tpot", float("inf"))]  # fmt: skip
    served = [r.served_by or "" for r in done]
    return {
        "requests": len(done),
        "failed": sum(1 for r in records if r.error and not r.error.startswith("cancelled")),
        "tpot_ms_p50": _ms(_pct(tpot, 50)), "tpot_ms_p99": _ms(_pct(tpot, 99)),
        "ttft_ms_p50": _ms(_pct(ttft, 50)), "ttft_ms_p99": _ms(_pct(ttft, 99)),
        "output_tps": round(tokens / (end - start), 2) if end > start else 0.0,
        "goodput_rps": round(len(good) / (end - start), 3) if end > start else 0.0,
        "spec_share": round(sum(s.startswith("spec") for s in served) / len(served), 3)
        if served else None,
    }  # fmt: skip


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _fresh(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "requests.jsonl").write_text("")


async def compare(plan: ComparePlan, out: Path) -> dict[str, Any]:
    _fresh(out)
    results: dict[str, Any] = {
        "trace": {"name": plan.trace.name,
                  "phases": [vars(p) for p in plan.trace.phases]},
        "slo": plan.slo, "dataset": plan.dataset.describe(), "policies": {},
    }  # fmt: skip
    timeline: dict[str, list[tuple[float, str]]] = {}
    for policy in plan.policies:
        router = ("serve", "--config", str(plan.router_config), "--policy", policy)
        async with (
            spawned(*router, ready="/ready") as url,
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_read=300),
            ) as session,
        ):
            print(f"{policy}: playing {plan.trace.name} ({plan.trace.seconds:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
            async with session.get(f"{url}/v1/models") as r:
                model = ((await r.json()).get("data") or [{}])[0].get("id", "default")
            bodies = (request_body(p, model, plan.ignore_eos)
                      for p in itertools.cycle(plan.dataset.prompts))  # fmt: skip
            start, records = await play(session, url, bodies, plan.trace, policy)
        phases, t = [], start
        for i, phase in enumerate(plan.trace.phases):
            mine = [r for r in records if r.repeat == i]
            phases.append({"concurrency": phase.concurrency}
                          | summarise(mine, t, t + phase.seconds, plan.slo))  # fmt: skip
            t += phase.seconds
        results["policies"][policy] = {
            "overall": summarise(records, start, start + plan.trace.seconds, plan.slo),
            "phases": phases,
        }
        timeline[policy] = [(r.start - start, r.served_by or "") for r in records if r.ok]
        with (out / "requests.jsonl").open("a") as f:
            for record in records:
                f.write(json.dumps(record.as_json()) + "\n")
        print(render_row(policy, results["policies"][policy]["overall"]), file=sys.stderr)
        await asyncio.sleep(1.0)  # cancelled requests leave the backends
    results["timeline"] = timeline
    (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


def render_row(policy: str, s: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:g}"

    return (
        f"{policy:<22} TPOT p50 {fmt(s['tpot_ms_p50'])} ms p99 {fmt(s['tpot_ms_p99'])} ms, "
        f"TTFT p50 {fmt(s['ttft_ms_p50'])} ms, {fmt(s['output_tps'])} tok/s, "
        f"goodput {fmt(s['goodput_rps'])} req/s, spec share {fmt(s['spec_share'])}"
    )


def render(results: dict[str, Any]) -> str:
    lines = [f"trace {results['trace']['name']}: per phase, median TPOT ms (spec share)"]
    policies = list(results["policies"])
    lines.append("phase  conc  " + "  ".join(f"{p:>20}" for p in policies))
    phases = results["trace"]["phases"]
    for i, phase in enumerate(phases):
        cells = []
        for p in policies:
            row = results["policies"][p]["phases"][i]
            share = "-" if row["spec_share"] is None else f"{row['spec_share']:.0%}"
            tpot = "-" if row["tpot_ms_p50"] is None else f"{row['tpot_ms_p50']:.2f}"
            cells.append(f"{tpot + ' (' + share + ')':>20}")
        lines.append(f"{i:>5}  {phase['concurrency']:>4}  " + "  ".join(cells))
    lines.append("overall:")
    lines += [render_row(p, results["policies"][p]["overall"]) for p in policies]
    return "\n".join(lines)
