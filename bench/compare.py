"""``specroute bench compare``: the same time-varying load through the router with each
policy in turn, against the same backends, summarised per phase and overall.

The router runs as its own process (``specroute serve --config FILE --policy NAME``), as a
user runs it; the backends stay up throughout, so every policy meets the same servers. A
policy may carry parameters over the config's (``crossover:crossover=21``), given to its
router as flags, so one comparison can run a policy beside itself with another setting.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from specroute.loadgen import lag
from specroute.loadgen.client import PhaseBodies, served_model
from specroute.loadgen.dataset import Dataset
from specroute.loadgen.drain import drained
from specroute.loadgen.record import RequestRecord, mean_latency, tokens_between
from specroute.loadgen.spawn import NO_DRAIN, spawned
from specroute.loadgen.trace import Trace, prompt_label
from specroute.loadgen.trace_loop import play
from specroute.policies.decision import PolicyError
from specroute.policies.registry import parse_spec

BASELINES = ("always-spec", "always-base")
DRAIN_SECONDS = 30.0  # for a run's cancelled requests to leave its backends


@dataclass(frozen=True)
class PolicySpec:
    """A policy as ``--policies`` names it: ``NAME`` or ``NAME:KEY=VALUE[:KEY=VALUE...]``,
    its parameters over the router config's. The text as given is its label in the results,
    so the same policy with two settings stays two policies."""

    label: str
    name: str
    params: tuple[tuple[str, str], ...] = ()

    @classmethod
    def parse(cls, text: str) -> PolicySpec:
        """An unknown policy, key or value is refused here, by name, before any router runs."""
        name, params = parse_spec(text)
        return cls(text.strip(), name, tuple(params.items()))

    def serve_flags(self) -> tuple[str, ...]:
        """``specroute serve`` flags choosing it."""
        flags = [f for key, value in self.params for f in ("--policy-param", f"{key}={value}")]
        return ("--policy", self.name, *flags)


def policy_specs(text: str) -> tuple[PolicySpec, ...]:
    """``--policies``: comma-separated, each label once."""
    specs = tuple(PolicySpec.parse(part) for part in text.split(",") if part.strip())
    labels = [s.label for s in specs]
    if not specs or len(set(labels)) < len(labels):
        raise PolicyError(f"--policies needs distinct policies, got {text!r}")
    return specs


@dataclass(frozen=True)
class ComparePlan:
    router_config: Path
    trace: Trace
    dataset: Dataset
    policies: tuple[str, ...] = ("crossover", *BASELINES)  # as PolicySpec.parse reads them
    slo: dict[str, float] = field(default_factory=dict)
    ignore_eos: bool = True
    settle: float = 0.0  # seconds of each phase left out of its figures
    seed: int = 0  # the rate phases' arrivals, and prompt lengths drawn per request
    output_len: int = 256  # the answers of prompts a phase names by length


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
    good = [
        r
        for r in done
        if (r.ttft() or 0) <= slo.get("ttft", float("inf"))
        and (r.tpot() or 0) <= slo.get("tpot", float("inf"))
    ]
    served = [r.served_by or "" for r in done]
    return {
        "requests": len(done),
        "failed": sum(1 for r in records if r.error and not r.error.startswith("cancelled")),
        "tpot_ms_p50": _ms(_pct(tpot, 50)),
        "tpot_ms_p99": _ms(_pct(tpot, 99)),
        "ttft_ms_p50": _ms(_pct(ttft, 50)),
        "ttft_ms_p99": _ms(_pct(ttft, 99)),
        "output_tps": round(tokens / (end - start), 2) if end > start else 0.0,
        "goodput_rps": round(len(good) / (end - start), 3) if end > start else 0.0,
        "spec_share": round(sum(s.startswith("spec") for s in served) / len(served), 3)
        if served
        else None,
    }


class Ticker:
    """While a policy plays, a line a second: the load, and where the requests that ended
    in that second had been sent, with their median TPOT."""

    def __init__(self, policy: str, trace: Trace, every: float = 1.0) -> None:
        self.policy, self.trace, self.every = policy, trace, every
        self.started = self.shown = time.monotonic()
        self.recent: list[RequestRecord] = []

    def __call__(self, record: RequestRecord) -> None:
        self.recent.append(record)
        now = time.monotonic()
        if now - self.shown < self.every:
            return
        done = [r for r in self.recent if r.ok]
        phase = self.trace.phase_at(now - self.started)
        load = "-" if phase is None else self.trace.phases[phase].load
        spec = sum((r.served_by or "").startswith("spec") for r in done)
        tpot = _ms(_pct([t for r in done if (t := r.tpot()) is not None], 50))
        print(
            f"  {self.policy:<20} {now - self.started:>6.1f} s  load {load:>6}  "
            f"{len(done):>3} done, {spec:>3} on spec, median TPOT {tpot} ms",
            file=sys.stderr,
            flush=True,
        )
        self.recent, self.shown = [], now


def phase_rows(
    trace: Trace,
    records: list[RequestRecord],
    start: float,
    slo: dict[str, float],
    settle: float = 0.0,
) -> list[dict[str, Any]]:
    """One summary per phase, its load named: the requests begun in it after its first
    ``settle`` seconds (while the load changes, routing and batches are in transition;
    what is left is the phase's steady state), and the tokens that arrived meanwhile."""
    rows = []
    for i, (phase, (_, steady, end)) in enumerate(
        zip(trace.phases, trace.spans(settle), strict=True)
    ):
        mine = [r for r in records if r.repeat == i and r.start >= start + steady]
        load = {"load": phase.load, "concurrency": phase.concurrency, "rate": phase.rate}
        rows.append(load | summarise(mine, start + steady, start + end, slo))
    return rows


def policy_summary(
    trace: Trace,
    records: list[RequestRecord],
    start: float,
    end: float,
    slo: dict[str, float],
    settle: float = 0.0,
) -> dict[str, Any]:
    """One policy's run: over the whole trace, per phase and per prompt length. Overall, it
    also gives ``tpot_ms_p50_phases``, the phases' median TPOT averaged over the trace's time:
    the overall median weighs each phase by the requests served in it, so in a closed loop
    the policy that serves the most at the peak reads slowest there."""
    phases = phase_rows(trace, records, start, slo, settle)
    by_phase = over_time(trace, [row["tpot_ms_p50"] for row in phases])
    return {
        "overall": summarise(records, start, end, slo)
        | {"tpot_ms_p50_phases": None if by_phase is None else round(by_phase, 3)},
        "phases": phases,
        "prompts": prompt_rows(trace, records, start, end, slo),
    }


def over_time(trace: Trace, values: list[float | None]) -> float | None:
    """One value per phase, averaged over the trace's time; phases without one (None) are
    left out, and None when none has one."""
    timed = [(p.seconds, v) for p, v in zip(trace.phases, values, strict=True) if v is not None]
    seconds = sum(s for s, _ in timed)
    return sum(s * v for s, v in timed) / seconds if seconds else None


def prompt_rows(
    trace: Trace, records: list[RequestRecord], start: float, end: float, slo: dict[str, float]
) -> dict[str, dict[str, Any]]:
    """When the trace names prompt lengths, one summary per length over the whole trace: the
    requests whose prompt, as the server counted it, is nearest that length (one without a
    count, such as a failed one, takes its phase's first length). The overall median mixes
    long and short requests; these keep them apart."""
    lengths = trace.input_lens
    if not lengths:
        return {}
    groups: dict[int, list[RequestRecord]] = {n: [] for n in lengths}
    for r in records:
        if r.prompt_tokens:
            counted = r.prompt_tokens
            groups[min(lengths, key=lambda n: abs(math.log(counted / n)))].append(r)
        elif named := trace.phases[r.repeat].input_len:
            groups[named[0]].append(r)
    return {str(n): summarise(group, start, end, slo) for n, group in groups.items()}


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _fresh(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "requests.jsonl").write_text("")


async def compare(plan: ComparePlan, out: Path) -> dict[str, Any]:
    _fresh(out)
    results: dict[str, Any] = {
        "trace": {"name": plan.trace.name, "phases": [vars(p) for p in plan.trace.phases]},
        "slo": plan.slo,
        "settle_seconds": plan.settle,
        "dataset": plan.dataset.describe(),
        "policies": {},
    }
    timeline: dict[str, list[tuple[float, str]]] = {}
    specs = [PolicySpec.parse(p) for p in plan.policies]
    for i, spec in enumerate(specs):
        policy = spec.label
        router = (
            "serve",
            "--config",
            str(plan.router_config),
            *spec.serve_flags(),
            *NO_DRAIN,
        )
        async with (
            spawned(*router, ready="/ready") as proxy,
            aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0),
                timeout=aiohttp.ClientTimeout(total=None, sock_read=300),
            ) as session,
        ):
            print(
                f"{policy}: playing {plan.trace.name} ({plan.trace.seconds:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            model = await served_model(session, proxy.url)
            bodies = PhaseBodies(
                plan.trace, plan.dataset, model, plan.ignore_eos, plan.output_len, plan.seed
            )
            ticker = Ticker(policy, plan.trace)
            backends = await backend_urls(session, proxy.url)
            before = await lag.clocks(session, backends)
            reading = asyncio.create_task(phase_clocks(session, backends, plan.trace))
            start, records = await play(
                session, proxy.url, bodies, plan.trace, policy, ticker, plan.seed
            )
            ends = await reading
        end = start + plan.trace.seconds
        after = ends[-1]  # the last phase's end is the run's
        behind = lag.overall(before, after)
        # the clients' times and the servers' are both wall seconds here
        away = lag.elsewhere(before, after, mean_latency(records), 1.0)
        summary = policy_summary(plan.trace, records, start, end, plan.slo, plan.settle)
        for row, (a, b) in zip(summary["phases"], itertools.pairwise([before, *ends]), strict=True):
            row["emulator_lag"] = _rounded(lag.overall(a, b))
        run = results["policies"][policy] = summary | {
            "emulator_lag": _rounded(behind),
            "elsewhere": _rounded(away),
        }
        if (worst := most_behind(run)) > lag.LIMIT:
            print(f"{policy}: {lag.late(worst)}", file=sys.stderr, flush=True)
        timeline[policy] = [(r.start - start, r.served_by or "") for r in records if r.ok]
        with (out / "requests.jsonl").open("a") as f:
            for record in records:
                f.write(json.dumps(record.as_json()) + "\n")
        print(render_row(policy, results["policies"][policy]["overall"]), file=sys.stderr)
        if i + 1 < len(specs):  # the next one starts on idle backends
            await _settled(backends, policy)
    results["timeline"] = timeline
    results["kept_time"] = kept_time(results)
    (out / "compare.json").write_text(json.dumps(results, indent=1) + "\n")
    return results


async def _settled(backends: list[str], policy: str) -> None:
    """The backends rid of the requests ``policy``'s run cancelled at its end, before the
    next policy's starts: read until idle, or a second where they cannot say (vLLM)."""
    async with aiohttp.ClientSession() as session:
        idle = await drained(session, backends, DRAIN_SECONDS) if backends else None
    if idle is None:
        await asyncio.sleep(1.0)  # a step of a real engine: cancelled requests leave in it
    elif not idle:
        print(
            f"{policy}: the backends still ran requests {DRAIN_SECONDS:g} s after its run "
            "ended; the next policy starts beside them",
            file=sys.stderr,
            flush=True,
        )


async def backend_urls(session: aiohttp.ClientSession, router: str) -> list[str]:
    """The backends as the router lists them in ``/router/status``, so that their clocks
    can be read; none, said, where the status cannot be read."""
    try:
        async with session.get(f"{router}/router/status") as r:
            status = await r.json() if r.status == 200 else {}
        if urls := [str(b["url"]) for b in status.get("backends", [])]:
            return urls
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        pass
    print("router status unreadable: the emulators' lag is not known", file=sys.stderr)
    return []


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


async def phase_clocks(
    session: aiohttp.ClientSession, urls: list[str], trace: Trace
) -> list[list[lag.Clock | None]]:
    """The servers' clocks at the end of each of ``trace``'s phases, from now: a phase of a
    few heavy seconds can fall behind where the whole run, mostly light, did not."""
    started, readings = time.monotonic(), []
    for end in itertools.accumulate(p.seconds for p in trace.phases):
        await asyncio.sleep(max(0.0, started + end - time.monotonic()))
        readings.append(await lag.clocks(session, urls))
    return readings


def phase_lags(run: dict[str, Any]) -> list[float]:
    """A policy's run's lags in each phase that could be read (none in runs made before
    they were)."""
    lags = (row.get("emulator_lag") for row in run["phases"])
    return [x for x in lags if x is not None]


def _lags(run: dict[str, Any]) -> list[float]:
    """A policy's run's lags that could be read: over the run and in each phase."""
    whole = run["emulator_lag"]
    return [*([] if whole is None else [whole]), *phase_lags(run)]


def most_behind(run: dict[str, Any]) -> float:
    """How far a policy's run fell behind at its worst: over the run or in one phase."""
    return max(_lags(run), default=0.0)


def kept_time(results: dict[str, Any]) -> bool | None:
    """Whether every policy's emulators kept their time scale, over its run and in each of
    its phases; None where no server said (real engines have no time scale to keep). A
    share of a request's time elsewhere is no part of it: every policy's run pays the same
    router and client, and where their shares differ, ``elsewhere`` says by how much."""
    known = [x for run in results["policies"].values() for x in _lags(run)]
    return all(x <= lag.LIMIT for x in known) if known else None


def render_row(policy: str, s: dict[str, Any]) -> str:
    def fmt(v: Any) -> str:
        return "-" if v is None else f"{v:g}"

    return (
        f"{policy:<22} TPOT p50 {fmt(s['tpot_ms_p50'])} ms p99 {fmt(s['tpot_ms_p99'])} ms, "
        f"TTFT p50 {fmt(s['ttft_ms_p50'])} ms, {fmt(s['output_tps'])} tok/s, "
        f"goodput {fmt(s['goodput_rps'])} req/s, spec share {fmt(s['spec_share'])}"
        + (
            f", TPOT p50 per phase {fmt(s['tpot_ms_p50_phases'])} ms"
            if "tpot_ms_p50_phases" in s
            else ""
        )
    )


def render(results: dict[str, Any]) -> str:
    lines = [f"trace {results['trace']['name']}: per phase, median TPOT ms (spec share)"]
    policies = list(results["policies"])
    width = max(20, *map(len, policies))
    lines.append("phase    load  prompts  " + "  ".join(f"{p:>{width}}" for p in policies))
    phases = results["trace"]["phases"]
    for i, phase in enumerate(phases):
        cells = []
        for p in policies:
            row = results["policies"][p]["phases"][i]
            share = "-" if row["spec_share"] is None else f"{row['spec_share']:.0%}"
            tpot = "-" if row["tpot_ms_p50"] is None else f"{row['tpot_ms_p50']:.2f}"
            cells.append(f"{tpot + ' (' + share + ')':>{width}}")
        load = f"{phase['rate']:g}/s" if phase.get("rate") is not None else phase["concurrency"]
        prompts = prompt_label(phase.get("input_len") or ()) or "-"
        lines.append(f"{i:>5}  {load:>6}  {prompts:>7}  " + "  ".join(cells))
    lines.append("overall:")
    lines += [render_row(p, results["policies"][p]["overall"]) for p in policies]
    for length in results["policies"][policies[0]].get("prompts", {}):
        lines.append(f"requests with {length}-token prompts:")
        lines += [render_row(p, results["policies"][p]["prompts"][length]) for p in policies]
    away = {
        p: r["elsewhere"] for p, r in results["policies"].items() if r.get("elsewhere") is not None
    }
    if away:
        shares = ", ".join(f"{p} {share:.1%}" for p, share in away.items())
        lines.append(f"a request's time elsewhere than in the servers (router, client): {shares}")
    if results.get("kept_time") is False:
        worst = max(most_behind(run) for run in results["policies"].values())
        lines.append(f"NOT KEPT TIME: {lag.late(worst)}")
    if "gap" in results:
        choice = ", ".join(results["oracle"]["choice"])
        lines.append(f"oracle: each phase to the faster static choice, known in advance ({choice})")
        for p, g in results["gap"].items():
            tpot = "-" if g["tpot"] is None else f"{g['tpot']:+.1%}"
            tps = "-" if g["output_tps"] is None else f"{g['output_tps']:+.1%}"
            lines.append(
                f"gap to oracle  {p:<22} median TPOT {tpot} (mean over the phases), "
                f"output tok/s {tps}"
            )
    return "\n".join(lines)
