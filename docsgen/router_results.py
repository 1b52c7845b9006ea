"""Tables of the router's and the emulator's benchmarks: overhead, replicas, chaos, soak,
capacity, each read from the JSON its command wrote."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from docsgen.markdown import code, number, table
from specroute.bench.affinity import shown_split
from specroute.bench.overhead_report import same_load
from specroute.bench.overhead_targets import family
from specroute.loadgen import lag

Loader = Callable[[str], Any]


def _median(spread: dict[str, float] | None, digits: int = 2) -> str:
    return "-" if spread is None else number(spread["median"], digits)


def _spread(spread: dict[str, float] | None, digits: int = 2) -> str:
    if spread is None:
        return "-"
    low, mid, high = (number(spread[k], digits) for k in ("min", "median", "max"))
    return f"{mid} ({low} to {high})"


_COMPARED = ("ttfc_p50", "ttfc_p99", "router_cpu_ms_per_request", "requests_per_s")
_WHAT = {
    "ttfc_p50": "added first-chunk p50, ms",
    "ttfc_p99": "added first-chunk p99, ms",
    "router_cpu_ms_per_request": "router CPU per request, ms",
    "requests_per_s": "requests/s",
}


_MODE_NAMES = {"stream": "streamed", "whole": "whole answers"}  # the tables' first column


def _floor(target: str) -> bool:
    """A pass-through that decides nothing: bare, bare-wN, lean."""
    return target == "lean" or family(target) == "bare"


def _reference_order(targets: list[str]) -> list[str]:
    """specroute's targets first, then the gateways, then the pass-throughs."""
    ours = [t for t in targets if t.startswith("specroute")]
    floors = [t for t in targets if _floor(t)]
    return ours + [t for t in targets if t not in (*ours, *floors, "direct")] + floors


def _figure(row: dict[str, Any] | None, name: str) -> float | None:
    if row is None:
        return None
    spread = row[f"added_{name}"] if name.startswith("ttfc") else row[name]
    return None if spread is None else float(spread["median"])


def overhead_reference(document: dict[str, Any]) -> str:
    """Per mode, a figure a row and a level a column, every target side by side in each
    cell (``a / b / c``, the targets in the order the header names); then each target's
    CPU per request over the first gateway's (below 1: cheaper)."""
    targets = _reference_order(list(document["targets"]))
    gateway = next((t for t in targets if not t.startswith("specroute") and not _floor(t)), None)
    rows_of = {(r["mode"], r["level"], r["target"]): r for r in document["summary"]}
    parts = []
    for mode in dict.fromkeys(r["mode"] for r in document["summary"]):
        levels = sorted({r["level"] for r in document["summary"] if r["mode"] == mode})
        body = []
        for name in _COMPARED:
            cells = []
            for level in levels:
                got = [_figure(rows_of.get((mode, level, t)), name) for t in targets]
                digits = 0 if name == "requests_per_s" else 2
                cells.append(" / ".join(number(g, digits) for g in got))
            body.append([f"{_WHAT[name]}: {' / '.join(targets)}", *cells])
        if gateway is not None:
            others = [t for t in targets if t != gateway]
            cells = []
            for level in levels:
                theirs = _figure(rows_of.get((mode, level, gateway)), "router_cpu_ms_per_request")
                ours = [
                    _figure(rows_of.get((mode, level, t)), "router_cpu_ms_per_request")
                    for t in others
                ]
                cells.append(
                    " / ".join(
                        "-" if o is None or not theirs else f"{o / theirs:.2f}" for o in ours
                    )
                )
            body.append([f"CPU per request over {gateway}'s: {' / '.join(others)}", *cells])
        header = [_MODE_NAMES.get(mode, mode), *(str(n) for n in levels)]
        parts.append(table(header, body, "l" + "r" * len(levels)))
    return "\n".join(parts)


_TARGET_ROWS: tuple[tuple[str, str, str, str, str, str, tuple[int, ...]], ...] = (
    # what, mode, figure, ours, theirs, how (ratio, less, or the pair), levels
    ("router CPU per stream, one worker over smg's", "stream", "router_cpu_ms_per_request",
     "specroute-w1", "smg", "ratio", (16, 64, 256, 512)),
    ("router CPU per whole answer, one worker over smg's", "whole", "router_cpu_ms_per_request",
     "specroute-w1", "smg", "ratio", (16, 64, 256, 512)),
    ("added first-chunk p50, one worker less smg's, ms", "stream", "ttfc_p50",
     "specroute-w1", "smg", "less", (1, 16, 64)),
    ("first-chunk p99 over smg's, two workers, streams", "stream", "ttfc_p99",
     "specroute-w2", "smg", "ratio", (1, 16, 64, 256, 512)),
    ("first-chunk p99 over smg's, two workers, whole answers", "whole", "ttfc_p99",
     "specroute-w2", "smg", "ratio", (1, 16, 64, 256, 512)),
    ("streams/s, one worker / smg", "stream", "requests_per_s",
     "specroute-w1", "smg", "pair", (256, 512)),
    ("router CPU per stream, two workers over one", "stream", "router_cpu_ms_per_request",
     "specroute-w2", "specroute-w1", "ratio", (16, 64, 256, 512)),
    ("router CPU per whole answer, two workers over one", "whole", "router_cpu_ms_per_request",
     "specroute-w2", "specroute-w1", "ratio", (16, 64, 256, 512)),
    ("the same for the bare pass-through, per stream", "stream", "router_cpu_ms_per_request",
     "bare-w2", "bare", "ratio", (16, 64, 256, 512)),
)  # fmt: skip


def overhead(document: dict[str, Any]) -> str:
    """Per mode and level, each target's added first-chunk time and router CPU."""
    parts = []
    names = {"stream": "Streamed answers", "whole": "Whole answers"}
    for mode in dict.fromkeys(r["mode"] for r in document["summary"]):
        rows = [
            [
                str(r["level"]),
                code(r["target"]),
                _spread(r["added_ttfc_p50"]),
                _spread(r["added_ttfc_p99"], 1),
                _median(r["requests_per_s"], 0),
                _median(r["chunks_per_s"], 0),
                _spread(r["router_cpu_ms_per_request"], 3),
                _median(r["router_cores"]),
            ]
            for r in document["summary"]
            if r["mode"] == mode and r["target"] != "direct"
        ]
        header = [
            "level",
            "target",
            "added TTFC p50, ms",
            "added TTFC p99, ms",
            "requests/s",
            "chunks/s",
            "router CPU ms/request",
            "router cores",
        ]
        parts.append(
            f"**{names.get(mode, mode)}** (medians over the repeats, their range in brackets)\n"
        )
        parts.append(table(header, rows, "rlrrrrrr"))
    notes = document.get("notes") or []
    if notes:
        parts.append("\n".join(f"- {n}" for n in notes) + "\n")
    return "\n".join(parts)


def replicas(document: dict[str, Any]) -> str:
    rows = [
        [
            str(r["replicas"]),
            code(r["source"]),
            f"{r['poll']:g}",
            f"{r['ramp']['share']:.3f}",
            f"{r['share_off']:+.3f}",
            f"{r['worst_level_off']:.3f}",
            lag.shown(r.get("emulator_lag")),
        ]
        for r in document["rows"]
    ]
    header = ["routers", "load source", "poll (s)", "speculative share", "off one router's"]
    return table([*header, "worst level off", "emulator lag"], rows, "rlrrrrr")


def affinity(document: dict[str, Any]) -> str:
    plan = document["plan"]
    rows = [
        [
            code(r["placement"]),
            f"{r['hit_rate']:.1%}",
            f"{r['ttft_mean'] * 1000:.1f}",
            f"{r['ttft_p50'] * 1000:.1f}",
            f"{r['ttft_p90'] * 1000:.1f}",
            f"{r['spec_share']:.1%}",
            shown_split(r.get("split")),
            lag.shown(r.get("emulator_lag")),
        ]
        for r in document["results"]
    ]
    about = (
        f"{plan['requests']} chats at {plan['rate']:g} a modelled second, each one of "
        f"{plan['system_prompts']} system prompts of {plan['system_words']} words and a "
        f"question of its own; `{plan['hardware']}` servers with "
        f"`--radix-cache-tokens {plan['cache_tokens']}`, crossover {plan['crossover']} a "
        f"speculative server, time scale {plan['time_scale']:g} (times are wall "
        "milliseconds at that scale, router and HTTP included)\n"
    )
    header = ["placement", "cache hit rate", "TTFT mean, ms", "p50", "p90", "speculative share"]
    header += ["system prompts per speculative server (hash)", "emulator lag"]
    return "\n".join([about, table(header, rows, "lrrrrrrr")])


def _counts(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items() if isinstance(v, int | float))


def checks(document: dict[str, Any]) -> str:
    rows = [
        [code(name), "holds" if found is None else found]
        for name, found in document["checks"].items()
    ]
    return table(["check", "result"], rows)


def chaos(document: dict[str, Any]) -> str:
    tally = document["tally"]
    lines = [
        f"{document['plan']['requests']:,} requests in {document['seconds']:.0f} s; "
        f"{len(document['events'])} events of the schedule, restarts "
        f"{sum(document['restarts'].values())}; every check "
        f"{'held' if document['ok'] else 'did not hold'}.\n",
    ]
    rows = [[code(k), _counts(v) if isinstance(v, dict) else str(v)] for k, v in tally.items()]
    lines.append(table(["tally", "counts"], rows))
    lines.append(checks(document))
    return "\n".join(lines)


def soak(document: dict[str, Any]) -> str:
    points = [("before the first request", document["start"])]
    points += [(f"after {s['requests']:,}", s) for s in document["samples"]]
    points.append(("after the idle pause", document["end"]))
    rows = [
        [
            label,
            f"{s['router']['rss_kb'] / 1000:.1f} MB",
            str(s["router"]["fds"]),
            f"{s['router']['clients']} / {s['router']['upstream']}",
            str(s["router"]["threads"]),
            str(s["tasks"]),
        ]
        for label, s in points
    ]
    header = ["point", "router RSS", "descriptors", "client / upstream connections"]
    growth = document.get("rss_growth_per_10k_kb")
    summary = (
        f"{document['end']['requests']:,} requests in {document['seconds']:.0f} s; the router's "
        f"memory moved by {'-' if growth is None else f'{growth:+.0f} kB'} per 10,000 requests "
        f"after the first sample; every check {'held' if document['ok'] else 'did not hold'}.\n"
    )
    return "\n".join(
        [summary, table([*header, "threads", "tasks"], rows, "lrrrrr"), checks(document)]
    )


def capacity(document: dict[str, Any]) -> str:
    rows = [
        [
            str(r["level"]),
            "-" if r["lag"] is None else f"{r['lag']:+.1%}",
            number(r["tokens_per_s"], 0),
            number(r["chunks_per_s"], 0),
            "-" if r["step_ms"] is None else number(r["step_ms"], 1),
            "-" if r["emulator_cpu"] is None else f"{r['emulator_cpu']:.0%}",
            f"{r['client_cpu']:.0%}",
        ]
        for r in document["results"]
    ]
    header = ["streams", "lag", "output tok/s", "chunks/s", "step, ms", "emulator CPU"]
    about = (
        f"`{document['hardware']}`, `--mode {document['mode']}`, time scale "
        f"{document['time_scale']:g}: {document['verdict']}\n"
    )
    return "\n".join([about, table([*header, "load generator CPU"], rows, "rrrrrrr")])


def overhead_workers(document: dict[str, Any]) -> str:
    """Per mode, router CPU per request at each level for each process count, of the bare
    pass-through and of specroute side by side, and what the most processes cost over one."""
    rows_of = {(r["mode"], r["level"], r["target"]): r for r in document["summary"]}
    families = {
        name: [t for t in document["targets"] if family(t) == name]
        for name in ("bare", "specroute")
    }
    parts = []
    for mode in dict.fromkeys(r["mode"] for r in document["summary"]):
        levels = sorted({r["level"] for r in document["summary"] if r["mode"] == mode})
        body = []
        for level in levels:
            cells = [str(level)]
            for members in families.values():
                got = [
                    _figure(rows_of.get((mode, level, t)), "router_cpu_ms_per_request")
                    for t in members
                ]
                cells.append(" / ".join(number(g, 2) for g in got))
                first, last = got[0], got[-1]
                cells.append("-" if first is None or last is None else f"{last / first:.2f}x")
            body.append(cells)
        header = [f"{_MODE_NAMES.get(mode, mode)}: level"]
        for name, members in families.items():
            header += [f"{name}: {' / '.join(members)}", f"{members[-1]} over {members[0]}"]
        parts.append(table(header, body, "r" * len(header)))
    return "\n".join(parts)


def overhead_shares(document: dict[str, Any]) -> str:
    """Per mode and level, each target of several processes' router CPU per request over
    its family's one process at the level that puts the same load on each process
    (``same_load``), and over one at the same level."""
    shares = same_load(document["summary"])
    if not shares:
        return "Not measured in this run."
    rows_of = {(r["mode"], r["level"], r["target"]): r for r in document["summary"]}
    targets = list(dict.fromkeys(p["target"] for p in shares))
    parts = []
    for mode in dict.fromkeys(p["mode"] for p in shares):
        mine = {(p["level"], p["target"]): p for p in shares if p["mode"] == mode}
        body = []
        for level in sorted({lv for lv, _ in mine}):
            cells = [str(level)]
            for t in targets:
                p = mine.get((level, t))
                if p is None:
                    cells += ["-", "-"]
                    continue
                same = _figure(
                    rows_of.get((mode, level, p["against"])), "router_cpu_ms_per_request"
                )
                ours = _figure(rows_of.get((mode, level, t)), "router_cpu_ms_per_request")
                cells.append(f"{p['ratio']:.2f}x (at {p['against_level']})")
                cells.append("-" if ours is None or not same else f"{ours / same:.2f}x")
            body.append(cells)
        header = [f"{_MODE_NAMES.get(mode, mode)}: level"]
        for t in targets:
            against = next(p["against"] for p in shares if p["target"] == t)
            header += [f"{t} over {against}, the same load a process", "the same level"]
        parts.append(table(header, body, "r" * len(header)))
    return "\n".join(parts)


def overhead_wake(document: dict[str, Any]) -> str:
    """What waking cost on a router core of the run, before any load: the unit's CPU
    time back to back and after each sleep, and its ratio to back to back."""
    wake = document.get("wake")
    if wake is None:
        return "Not measured in this run."
    busy, woken = wake["busy_us"], wake["woken_us"]
    header = ["core", "back to back, µs", *(f"after each {s} ms sleep, µs" for s in woken)]
    where = "-" if wake["core"] is None else str(wake["core"])
    cells = [where, number(busy, 0), *(f"{number(v, 0)} ({v / busy:.2f}x)" for v in woken.values())]
    return table(header, [cells], "r" * len(header))


def overhead_wakes(document: dict[str, Any]) -> str:
    """Per mode and level, each Python router's wake-ups a request (how many times the
    scheduler put its processes on a core), every process count of each side by side."""
    rows = document["summary"]
    if not any("router_wakes_per_request" in r for r in rows):
        return "Not measured in this run."
    rows_of = {(r["mode"], r["level"], r["target"]): r for r in rows}
    targets = [t for t in document["targets"] if family(t) in ("bare", "specroute")]
    parts = []
    for mode in dict.fromkeys(r["mode"] for r in rows):
        body = [
            [
                str(level),
                *(
                    number(_figure(rows_of.get((mode, level, t)), "router_wakes_per_request"), 1)
                    for t in targets
                ),
            ]
            for level in sorted({r["level"] for r in rows if r["mode"] == mode})
        ]
        header = [f"{_MODE_NAMES.get(mode, mode)}: level", *targets]
        parts.append(table(header, body, "r" * len(header)))
    return "\n".join(parts)


def overhead_split(before: dict[str, Any], after: dict[str, Any]) -> str:
    """One worker's router CPU per request on the code before the router's split and after
    it, each beside smg in its own run, and after over before (the same command, one run
    after the other on one machine)."""
    was_of, now_of = (
        {(r["mode"], r["level"], r["target"]): r for r in document["summary"]}
        for document in (before, after)
    )
    rows = []
    for mode, level, target in sorted(now_of):
        if target != "specroute-w1":
            continue
        was, now, smg_was, smg_now = (
            _figure(run.get((mode, level, t)), "router_cpu_ms_per_request")
            for run, t in ((was_of, target), (now_of, target), (was_of, "smg"), (now_of, "smg"))
        )
        if was is None or now is None or smg_was is None or smg_now is None:
            continue
        rows.append(
            [
                _MODE_NAMES.get(mode, mode),
                str(level),
                f"{was:.3f} ({was / smg_was:.2f}x)",
                f"{now:.3f} ({now / smg_now:.2f}x)",
                f"{smg_was:.3f} / {smg_now:.3f}",
                f"{now / was:.2f}",
            ]
        )
    header = [
        "answers",
        "level",
        "before, ms (over smg)",
        "after, ms (over smg)",
        "smg, ms",
        "after / before",
    ]
    return table(header, rows, "lrrrrr")


def overhead_baseline(document: dict[str, Any]) -> str:
    """One worker's router CPU per request on this code and on the baseline's, in one run
    (``--baseline``: their windows in turns), the median of the repeats and their range,
    each beside smg, and this over the baseline: the medians' ratio and the range of the
    ratio of any two of their windows."""
    of = {(r["mode"], r["level"], r["target"]): r for r in document["summary"]}
    rows = []
    for mode, level, target in sorted(of):
        baseline = of.get((mode, level, target + "-baseline"))
        if not target.startswith("specroute-w") or target.endswith("-baseline") or not baseline:
            continue
        now, was = (row["router_cpu_ms_per_request"] for row in (of[mode, level, target], baseline))
        smg = _figure(of.get((mode, level, "smg")), "router_cpu_ms_per_request")
        rows.append(
            [
                _MODE_NAMES.get(mode, mode),
                str(level),
                f"{was['median']:.3f} [{was['min']:.3f}..{was['max']:.3f}]",
                f"{now['median']:.3f} [{now['min']:.3f}..{now['max']:.3f}]",
                "" if smg is None else f"{smg:.3f}",
                f"{now['median'] / was['median']:.2f}",
                f"{now['min'] / was['max']:.2f}..{now['max'] / was['min']:.2f}",
            ]
        )
    header = ["answers", "level", "before, ms", "after, ms", "smg, ms", "after / before", "range"]
    return table(header, rows, "lrrrrrr")


def overhead_calls(document: dict[str, Any]) -> str:
    """A request's Python calls in one router worker, this code against the baseline's,
    and the functions called most more and most less often a request."""
    rows = []
    for mode, row in document["modes"].items():
        listed = [
            ", ".join(f"`{name}` {n:+g}" for name, n in row[way][:5]) for way in ("more", "fewer")
        ]
        rows.append(
            [
                _MODE_NAMES.get(mode, mode),
                f"{row['baseline']:.1f}",
                f"{row['this']:.1f}",
                f"{row['ratio']:.3f}",
                *listed,
            ]
        )
    header = ["answers", "baseline", "this code", "this / baseline", "called more", "called less"]
    return table(header, rows, "lrrrll")


RENDERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "overhead": overhead,
    "overhead-wakes": overhead_wakes,
    "overhead-wake": overhead_wake,
    "overhead-workers": overhead_workers,
    "overhead-shares": overhead_shares,
    "overhead-workers-shares": overhead_shares,
    "overhead-reference": overhead_reference,
    "overhead-lean": overhead_reference,
    "overhead-front": overhead_reference,
    "overhead-tail": overhead_reference,
    "replicas": replicas,
    "affinity": affinity,
    "chaos": chaos,
    "soak": soak,
    "capacity": capacity,
}


RUN_OF = {
    "overhead-workers-shares": "overhead-workers",
    "overhead-reference": "overhead",
    "overhead-wake": "overhead",
    "overhead-wakes": "overhead",
}  # a table of a run named otherwise


def blocks(load: Loader) -> dict[str, Callable[[], str]]:
    """Each table as a block of no arguments: its run (of the same name unless ``RUN_OF``
    says), rendered."""

    def block(name: str) -> Callable[[], str]:
        return lambda: RENDERS[name](load(RUN_OF.get(name, name)))

    return {name: block(name) for name in RENDERS}
