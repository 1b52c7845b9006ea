"""What a team could deploy on the same GPUs instead of specroute, and specroute, on the same
production traffic: the head-to-head of ``specroute bench deployments``.

Each contender (``bench.contenders``) serves the same requests, open loop, at rates that put
its GPUs at stated utilisations: offline in virtual time at each, and, where asked, live on
emulated servers behind a router process at some. The traffic is a window of the Azure LLM
inference trace 2023 (conversation half) as it came, or its requests arriving as a ramp or a
day (``loadgen.request_trace.shaped``). A utilisation is the trace's output tokens a second
(over its mean rate, or its busiest phase's for a ramp or a day) over what the plain servers
deliver saturated (at their largest predicted level, requests of the trace's mean lengths).

The oracle is no deployment: each minute's requests (by arrival) as whichever of the plain
and the EAGLE-3 deployment served them sooner (the lower mean time from arrival to the last
token, an unfinished request counting as never), as if one server could be either, minute
by minute, knowing the traffic in advance and paying nothing to switch.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from specroute.bench.compare import summarise
from specroute.bench.contenders import setup
from specroute.bench.live_contender import serve_live
from specroute.bench.offline_contender import serve
from specroute.loadgen import lag
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.request_trace import RequestTrace
from specroute.policies.crossover import Topology
from specroute.policies.profile import Profile

ORACLE = "oracle"
MINUTE = 60.0  # the oracle's choice holds this long


@dataclass(frozen=True)
class Live:
    """The utilisations also run live, and the emulated servers' time scale there."""

    utilisations: tuple[float, ...]
    time_scale: float = 0.1


def oracle(
    plain: list[RequestRecord], eagle: list[RequestRecord]
) -> tuple[list[RequestRecord], dict[str, int]]:
    """Each minute's requests as the better of the two runs of the same trace served them
    (see the module's note), and the minutes each had."""
    minutes: dict[int, list[int]] = {}
    for i, record in enumerate(plain):
        minutes.setdefault(int(record.start // MINUTE), []).append(i)
    chosen: list[RequestRecord] = []
    counts = {"plain": 0, "eagle": 0}
    for indices in minutes.values():
        name, runs = min(
            (("plain", plain), ("eagle", eagle)),
            key=lambda named: _mean_latency([named[1][i] for i in indices]),
        )
        counts[name] += 1
        chosen += [runs[i] for i in indices]
    return sorted(chosen, key=lambda r: r.start), counts


def _mean_latency(records: list[RequestRecord]) -> float:
    return statistics.mean(math.inf if r.end is None else r.end - r.start for r in records)


def head_to_head(
    model: Sequence[str],
    trace: RequestTrace,
    utilisations: list[float],
    slo: dict[str, float],
    progress: Callable[[str], None] = lambda _: None,
    topology: Topology = "shared",
    live: Live | None = None,
) -> dict[str, Any]:
    """Each contender at each utilisation, offline and (``live``) live: its figures over
    the trace's span (requests not finished by twice the span are counted unfinished)."""
    prompts = statistics.mean(r.prompt_tokens for r in trace.requests)
    outputs = statistics.mean(r.output_tokens for r in trace.requests)
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        built = setup(model, int(prompts), int(outputs), folder, topology)
        demand = trace.peak_rate * outputs
        rows: dict[str, dict[str, Any]] = {}
        for utilisation in utilisations:
            factor = utilisation * built.capacity_tps / demand
            offered = trace.scaled(factor)
            span = offered.seconds
            row: dict[str, Any] = {"rate_factor": round(factor, 4), "rate": round(offered.rate, 3)}
            said = partial(_progress, progress, f"utilisation {utilisation:g}")
            runs = {c.name: serve(c, offered, 2 * span) for c in built.contenders}
            row |= _figures(runs, span, slo, said)
            if live is not None and utilisation in live.utilisations:
                played = {
                    c.name: asyncio.run(
                        serve_live(c, offered, model, live.time_scale, folder, 2 * span)
                    )
                    for c in built.contenders
                }
                said = partial(_progress, progress, f"live {utilisation:g}")
                row["live"] = _figures({n: p.records for n, p in played.items()}, span, slo, said)
                for measure in ("lag", "elsewhere"):
                    each = [v for p in played.values() if (v := getattr(p, measure)) is not None]
                    row["live"][measure] = round(max(each), 4) if each else None
                row["live"]["time_scale"] = live.time_scale
            rows[f"{utilisation:g}"] = row
    return {
        "hardware": built.contenders[0].servers[0].config.hardware.name,
        "topology": topology,
        "trace": trace.describe(),
        "slo": slo,
        "capacity_tps": round(built.capacity_tps, 2),
        "crossover": _crossing(built.profile),
        "pair_crossover": None if built.pair_profile is None else _crossing(built.pair_profile),
        "schedule": built.schedule,
        "kv_tokens": built.memory,
        "contenders": [c.name for c in built.contenders],
        "unfit": built.unfit,
        "utilisations": rows,
    }


def _figures(
    runs: dict[str, list[RequestRecord]],
    span: float,
    slo: dict[str, float],
    said: Callable[[str, dict[str, Any]], None],
) -> dict[str, Any]:
    """Each run's figures over the span, and the oracle's made of the plain and EAGLE-3
    runs."""
    best, minutes = oracle(runs["plain"], runs["eagle"])
    out: dict[str, Any] = {}
    for name, records in {**runs, ORACLE: best}.items():
        out[name] = summarise(records, 0.0, span, slo)
        out[name]["unfinished"] = sum(1 for r in records if r.end is None)
        said(name, out[name])
    out[ORACLE]["minutes"] = minutes
    return out


def _progress(progress: Callable[[str], None], where: str, name: str, f: dict[str, Any]) -> None:
    progress(
        f"{where}: {name} {f['output_tps']} tok/s, TPOT p50 {f['tpot_ms_p50']} ms, "
        f"TTFT p99 {f['ttft_ms_p99']} ms"
    )


def _crossing(profile: Profile) -> dict[str, Any]:
    crossover = profile.crossover
    return {"value": crossover.value, "bound": crossover.bound, "limit": crossover.limit}


COLUMNS = (
    ("output_tps", "tok/s"),
    ("tpot_ms_p50", "TPOT p50"),
    ("tpot_ms_p99", "TPOT p99"),
    ("ttft_ms_p50", "TTFT p50"),
    ("ttft_ms_p99", "TTFT p99"),
    ("goodput_rps", "goodput/s"),
)


def _shown(
    document: dict[str, Any], live: bool
) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Each utilisation (only those that ran live, for ``live``), its row and the figures
    shown of it: the offline ones, or the live ones."""
    return [
        (utilisation, row, row["live"] if live else row)
        for utilisation, row in document["utilisations"].items()
        if not live or "live" in row
    ]


def live_rows(document: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The utilisations that also ran live, each with its live figures."""
    return [(utilisation, shown) for utilisation, _, shown in _shown(document, True)]


def worst(document: dict[str, Any]) -> lag.Kept:
    """The most any live run's servers fell behind their time scale, and the most of a
    request's time any run's router and client took (``elsewhere``, absent from runs made
    before it was read); each None where none could say (or none ran live)."""
    rows = [r for _, r in live_rows(document)]
    lags = [r["lag"] for r in rows if r["lag"] is not None]
    away = [r["elsewhere"] for r in rows if r.get("elsewhere") is not None]
    return lag.Kept(max(lags) if lags else None, max(away) if away else None)


def rows(
    document: dict[str, Any], mark: Callable[[str], str] = "{}*".format, live: bool = False
) -> list[list[str]]:
    """A row a utilisation and contender, the oracle last (offline, or ``live`` where a
    utilisation ran live): the figures of ``COLUMNS`` (times in ms), the best contender's in
    each column at its utilisation ``mark``ed (a star; the oracle is not a contender)."""
    out = []
    names = document["contenders"]
    for utilisation, _, shown in _shown(document, live):
        best = {key: _best(key, [shown[n][key] for n in names]) for key, _ in COLUMNS}
        for name in [*names, ORACLE]:
            figures = shown[name]
            cells = [
                _cell(figures[key], figures[key] == best[key] and name != ORACLE, mark)
                for key, _ in COLUMNS
            ]
            out.append([utilisation, name, *cells, str(figures.get("unfinished") or 0)])
    return out


def _best(key: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    higher = key in ("output_tps", "goodput_rps")
    return max(present) if higher else min(present)


def _cell(value: Any, best: bool, mark: Callable[[str], str]) -> str:
    text = "-" if value is None else f"{value:g}"
    return mark(text) if best and value is not None else text


ROUTED = ("specroute", "specroute-adaptive")  # the contenders specroute routes


def standings(document: dict[str, Any], live: bool = False) -> dict[str, dict[str, Any]]:
    """Per utilisation (offline, or ``live`` where it ran live): the contender with the most
    goodput, the lowest median TPOT breaking a tie; each routed contender's goodput over
    that best (None where the best has none); and whether even the best served under half
    the requests offered within the SLOs (``overloaded``: a queue that only grows, where a
    contender "wins" by the requests it lets wait)."""
    out: dict[str, dict[str, Any]] = {}
    names = document["contenders"]
    for utilisation, row, shown in _shown(document, live):
        best = max(
            names,
            key=lambda n: (shown[n]["goodput_rps"], -(shown[n]["tpot_ms_p50"] or math.inf)),
        )
        top = shown[best]["goodput_rps"]
        routed = [n for n in ROUTED if n in names]
        out[utilisation] = {
            "best": best,
            "overloaded": top < row["rate"] / 2,
            **{n: round(shown[n]["goodput_rps"] / top, 3) if top else None for n in routed},
        }
    return out


def kept_time(document: dict[str, Any]) -> bool | None:
    """Whether every live run kept its time (``loadgen.lag.Kept``); None where none ran
    live."""
    return worst(document).kept if live_rows(document) else None


def render(document: dict[str, Any]) -> str:
    header = "  ".join(["util.", "contender", *(label for _, label in COLUMNS), "unfinished"])
    lines = [
        f"{document['hardware']} ({document['topology']}): {document['trace']['source']}",
        f"the plain server saturated: {document['capacity_tps']} tok/s; the crossover of "
        f"servers with all of the memory: {document['crossover']['value']}, of the pair as "
        f"deployed: {(document['pair_crossover'] or {}).get('value')}; SLO {document['slo']}",
        *(f"{name}: {why}" for name, why in document["unfit"].items()),
        "offline, in virtual time:",
        header,
        *("  ".join(row) for row in rows(document)),
    ]
    live = live_rows(document)
    if live:
        lines += [
            "live, on emulated servers behind a router: "
            + ", ".join(
                f"{u} at time scale {r['time_scale']:g}, {lag.shown(r['lag'])}"
                + ("" if r.get("elsewhere") is None else f", {r['elsewhere']:.1%} elsewhere")
                for u, r in live
            ),
            header,
            *("  ".join(row) for row in rows(document, live=True)),
        ]
    lines.append(
        "most goodput: "
        + "; ".join(
            f"{u} {said['best']}"
            + (" (overloaded)" if said["overloaded"] else "")
            + "".join(f", {n} {said[n]:.0%} of it" for n in ROUTED if said.get(n) is not None)
            for u, said in standings(document).items()
        )
    )
    if kept_time(document) is False:
        lines.append(f"NOT KEPT TIME: {worst(document).said()}; the live rows are not to be read")
    return "\n".join(lines)
