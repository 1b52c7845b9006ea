"""The results tables, each read from a committed run's JSON (``runs.RUNS``), and the note
that says which command made a page's numbers and when."""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import cache
from typing import Any

from docsgen import router_results
from docsgen.compare_results import compare_table, phases_table, prompts_table
from docsgen.markdown import code, number, table
from docsgen.runs import MACHINE, RUNS
from specroute.bench.convergence import render as convergence_table
from specroute.bench.coverage import render as coverage_table
from specroute.bench.deployments import COLUMNS as DEPLOYMENT_COLUMNS
from specroute.bench.deployments import ROUTED, kept_time, live_rows, standings, worst
from specroute.bench.deployments import rows as deployment_rows
from specroute.loadgen.lag import shown
from specroute.profiler.report import interval_text, render_report

DATA_LINK = "@data"  # the hook makes it relative to the page (docsgen.hooks.fill)


@cache
def load(name: str) -> Any:
    if name not in RUNS:
        raise KeyError(f"no run named {name!r} in docsgen/runs.py")
    return json.loads(RUNS[name].data(name).read_text())


def made_by(*names: str) -> str:
    """An admonition naming each run's command, day and JSON."""
    lines = ['!!! info "How these numbers were made"', ""]
    for name in names:
        run, document = RUNS[name], load(name)
        said = document if isinstance(document, dict) else {}  # what a run says of itself
        lines.append(f"    - `{said.get('command') or run.command}`")
        day = said.get("date", run.date)
        where = f"on {day}, on {_machine(document)}"
        note = f"; {run.note}" if run.note else ""
        lines.append(f"      ({where}{note}): [{name}.json]({DATA_LINK}/{name}.json)")
    return "\n".join(lines) + "\n"


def _machine(document: Any) -> str:
    """The machine a run names in its JSON (its cores, and how it pinned its processes), else
    the project's; likewise its command and day, above."""
    if isinstance(document, dict) and "cores" in document and "machine" in document:
        return f"a machine of {document['cores']} cores, {document['machine']}"
    return MACHINE


def runs_table() -> str:
    rows = []
    for name, run in RUNS.items():
        figure = f"[{run.figure}](@figures/{run.figure})" if run.figure else ""
        rows.append(
            [f"[{name}.json]({DATA_LINK}/{name}.json)", code(run.command), run.date, figure]
        )
    return table(["JSON", "command", "day", "figure"], rows)


def _crossing_rows(metric: str, crossover: dict[str, Any]) -> list[list[str]]:
    rows = []
    for c in crossover.get("crossings") or []:
        turn = "starts paying" if c["direction"] == "up" else "stops paying"
        rows.append(
            [metric, turn, number(c["at"], 1), interval_text(c["ci"]), f"{c['support']:.0%}"]
        )
    return rows


def crossings(name: str) -> str:
    """Every crossing of a calibrated profile, per-request speed and throughput."""
    profile = load(name)
    rows = _crossing_rows("per-request speed (TPOT)", profile["crossover"])
    rows += _crossing_rows("total throughput", profile["throughput_crossover"])
    header = ["metric", "speculation", "at (concurrent requests)", "95% interval", "support"]
    return table(header, rows, "llrlr")


def levels(name: str) -> str:
    """A calibrated profile's per-level table, as its report gives it."""
    report = render_report(load(name))
    section = report.split("## Per level", 1)[1]
    body = section.split("\n## ", 1)[0]
    lines = body.strip().splitlines()
    return "\n".join(line for line in lines if line.startswith("|")) + "\n"


def report_summary(name: str) -> str:
    """The first paragraph of a calibrated profile's report: levels, runs, backend time."""
    report = render_report(load(name))
    return report.split("\n\n")[1] + "\n"


def buckets(name: str) -> str:
    """A v2 profile's crossover per context bucket."""
    rows = []
    for b in load(name)["context"]["buckets"]:
        c = b["crossover"]
        bands = ", ".join(
            f"{'1' if lo is None else number(lo, 1)} to {'∞' if hi is None else number(hi, 1)}"
            for lo, hi in c.get("bands") or []
        )
        value = "none" if c["value"] is None else number(c["value"], 1)
        ci = interval_text(c["ci"]) if c.get("ci") else ""
        seconds = b.get("backend_seconds")
        rows.append([number(b["context"], 0), value, ci, bands, number(seconds, 0)])
    header = ["context (KV tokens)", "crossover", "95% interval", "bands", "backend s"]
    return table(header, rows, "rrlrr")


def coverage() -> str:
    return coverage_table(load("coverage")) + "\n"


def predictions(model: str) -> str:
    """Speculative over plain at each level, per accept length: ``kimi`` or ``qwen``."""
    names = [n for n in RUNS if n.startswith(f"predict-{model}-")]
    first = load(names[0])
    header = ["accept length", *(str(r["concurrency"]) for r in first["levels"])]
    rows = []
    for name in names:
        cells = [f"{r['speedup']:.2f}/{r['total_speedup']:.2f}" for r in load(name)["levels"]]
        rows.append([name.rsplit("-", 1)[1], *cells])
    return table(header, rows, "l" + "r" * (len(header) - 1))


def context_predictions() -> str:
    """Predicted crossover per prompt length, per model and accept length."""
    rows = []
    for name in ("predict-sdpa-2.0", "predict-sdpa-default", "predict-folded-2.0"):
        found = load(name)
        cells = []
        for each in found:
            value = each.get("crossover")
            cells.append("above the last level" if value is None else number(value, 1))
        rows.append([code(RUNS[name].command.split()[3]), name.rsplit("-", 1)[1], *cells])
    lengths = [str(each["input_len"]) for each in load("predict-sdpa-2.0")]
    header = ["model", "accept length", *(f"{n}-token prompts" for n in lengths)]
    return table(header, rows, "llrrr")


def deployments(name: str, live: bool = False) -> str:
    """A head-to-head of deployments: each contender at each utilisation, the oracle last,
    the best contender's figure of each column there in bold; ``live``: the utilisations
    that also ran live, with the servers' time scale and how far they kept it."""
    document = load(name)
    header = [
        "utilisation",
        "deployment",
        *(label for _, label in DEPLOYMENT_COLUMNS),
        "unfinished",
    ]
    rows = deployment_rows(document, "**{}**".format, live=live)
    said = table(header, rows, "ll" + "r" * (len(DEPLOYMENT_COLUMNS) + 1))
    if not live:
        return said
    scales = "; ".join(
        f"at {u}, time scale {r['time_scale']:g}, the servers' lag {shown(r['lag'])}"
        + (
            ""
            if r.get("elsewhere") is None
            else f", {r['elsewhere']:.1%} of a request's time elsewhere"
        )
        for u, r in live_rows(document)
    )
    if kept_time(document) is False:
        warned = worst(document).said()
        return f'!!! warning "Not kept time"\n\n    {warned}\n\n{said}'
    return f"Live ({scales}):\n\n{said}"


def deployments_matrix(*names: str) -> str:
    """Every run's standings: at each utilisation, the deployment with the most goodput (in
    brackets where even it served under half the requests within the SLOs) and what the
    routed pair (and, partitioned, specroute over adaptive servers) had of it."""
    rows = []
    shares: list[str] = []
    for name in names:
        document = load(name)
        shares = list(document["utilisations"])
        cells = []
        for said in standings(document).values():
            routed = ", ".join(f"{n} {said[n]:.0%}" for n in ROUTED if said.get(n) is not None)
            best = f"**{said['best']}**" if not said["overloaded"] else f"({said['best']})"
            cells.append(best + (f"; {routed}" if routed else ""))
        unfit = "; the pair does not fit" if document["unfit"] else ""
        where = f"{document['hardware']}, {document['topology']}{unfit}"
        rows.append(
            [
                where,
                document["trace"]["name"].removeprefix("azure-llm-2023-conv").lstrip("-")
                or "azure",
                *cells,
            ]
        )
    header = ["model, topology", "traffic", *(f"at {u}" for u in shares)]
    return table(header, rows, "ll" + "l" * len(shares))


def deployments_setup(name: str) -> str:
    """What the head-to-head was built from: the trace, the crossovers, the schedule, and
    each deployment's KV cache."""
    document = load(name)
    said, pair = (
        "none" if (found := document[key]) is None
        else "above the last level" if found["value"] is None
        else number(found["value"], 1)
        for key in ("crossover", "pair_crossover")
    )  # fmt: skip
    caches = ", ".join(
        f"{contender} {' + '.join(number(n, 0) for n in sizes)}"
        for contender, sizes in document["kv_tokens"].items()
    )
    slo = ", ".join(f"{k} {v:g} s" for k, v in document["slo"].items())
    return (
        f"{document['trace']['source']}, {document['trace']['requests']:,} requests; the plain "
        f"server saturated delivers {number(document['capacity_tps'], 0)} tok/s; the crossover "
        f"of a speculative and a plain server with all of the memory: {said}, and the "
        f"schedule written from it: `{json.dumps(document['schedule'])}`; the crossover of "
        f"the pair's servers as deployed, which specroute routes by: {pair}; "
        f"KV cache, tokens: {caches}; goodput counts requests within {slo}."
        + "".join(f" {name}: {why}." for name, why in document["unfit"].items())
        + "\n"
    )


def _mode(name: str) -> str:
    """A comparison's column label: live or offline, as its run's name ends."""
    return name.rsplit("-", 1)[1] if name.endswith(("-live", "-offline")) else name


BLOCKS: dict[str, Callable[..., str]] = {
    "made-by": made_by,
    "deployments": deployments,
    "deployments-setup": deployments_setup,
    "deployments-live": lambda name: deployments(name, live=True),
    "deployments-matrix": deployments_matrix,
    "runs": runs_table,
    "convergence": lambda name: f"```text\n{convergence_table(load(name))}\n```\n",
    "crossings": crossings,
    "levels": levels,
    "report-summary": report_summary,
    "buckets": buckets,
    "coverage": coverage,
    "predictions": predictions,
    "context-predictions": context_predictions,
    "compare": lambda *names: compare_table([(_mode(n), load(n)) for n in names]),
    "phases": lambda name: phases_table(load(name)),
    "prompts": lambda name: prompts_table(load(name)),
    "overhead-split": lambda before, after: router_results.overhead_split(
        load(before), load(after)
    ),
    "overhead-baseline": lambda name: router_results.overhead_baseline(load(name)),
    "overhead-calls": lambda name: router_results.overhead_calls(load(name)),
    **router_results.blocks(load),
}
