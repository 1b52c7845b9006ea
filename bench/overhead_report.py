"""``specroute bench overhead``'s summary: per mode, level and target, each figure's median
over the repeats with its range, and the "added" figures (the target's less direct's in
the same repeat at the same level, so a slow repeat moves both); then the tables and the
JSON document."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from specroute.bench.overhead import OverheadPlan, Window
from specroute.bench.overhead_targets import counted, named

Getter = Callable[[Window], float | None]
FIGURES: dict[str, Getter] = {
    "ttfc_p50": lambda w: w.ttfc_p50,
    "ttfc_p99": lambda w: w.ttfc_p99,
    "gap_p50": lambda w: w.gap_p50,
    "requests_per_s": lambda w: w.requests_per_s,
    "chunks_per_s": lambda w: w.chunks_per_s,
    "router_cpu_ms_per_request": lambda w: w.router_cpu_ms_per_request,
    "router_wakes_per_request": lambda w: w.router_wakes_per_request,
    "router_cores": lambda w: w.router_cores,
    "backend_cores": lambda w: max(w.backend_cores),  # the busier backend
    "client_cores": lambda w: w.client_cores,
    "errors": lambda w: w.errors,
}
ADDED = ("ttfc_p50", "ttfc_p99", "gap_p50")
Spread = dict[str, float]  # median, min, max


def spread(values: Sequence[float | None]) -> Spread | None:
    found = [v for v in values if v is not None]
    if not found:
        return None
    return {"median": statistics.median(found), "min": min(found), "max": max(found)}


def summarize(windows: Sequence[Window], targets: Sequence[str]) -> list[dict[str, Any]]:
    """One row per mode, level and target, the targets in the order given."""
    groups: dict[tuple[str, int, str], list[Window]] = {}
    for w in sorted(windows, key=lambda w: (w.mode, w.level, targets.index(w.target))):
        groups.setdefault((w.mode, w.level, w.target), []).append(w)
    direct = {(w.mode, w.level, w.repeat): w for w in windows if w.target == "direct"}
    rows = []
    for (mode, level, target), group in groups.items():
        row: dict[str, Any] = {
            "mode": mode,
            "level": level,
            "target": target,
            "repeats": len(group),
        }
        for name, get in FIGURES.items():
            row[name] = spread([get(w) for w in group])
        for name in ADDED:
            get = FIGURES[name]
            pairs = [
                (get(w), get(d))
                for w in group
                if (d := direct.get((mode, level, w.repeat))) is not None
            ]
            diffs = [a - b for a, b in pairs if a is not None and b is not None]
            row[f"added_{name}"] = spread(diffs) if target != "direct" else None
        rows.append(row)
    return rows


def same_load(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Router CPU per request of each target of several processes (``bare-wN``,
    ``specroute-wN``) at a level, over its family's one process at that level divided by N,
    where both were measured: the same load on each process. Near 1, the processes cost
    what one costs at its share of the load (what more cost at the same total load is the
    spread itself); above, each process adds work of its own."""
    cpu = {(r["mode"], r["level"], r["target"]): r["router_cpu_ms_per_request"] for r in rows}
    found = []
    for (mode, level, target), spread in cpu.items():
        kind = counted(target)  # bare, bare-wN or specroute-wN: none with other flags
        if kind is None or spread is None:
            continue
        name, count = kind
        if count == 1 or level % count:
            continue
        against = named(name, 1)
        alone = cpu.get((mode, level // count, against))
        if alone is None or alone["median"] <= 0:
            continue
        found.append(
            {
                "mode": mode,
                "level": level,
                "target": target,
                "against": against,
                "against_level": level // count,
                "ratio": spread["median"] / alone["median"],
            }
        )
    return found


def _med(s: Spread | None, digits: int = 1) -> str:
    return "-" if s is None else f"{s['median']:.{digits}f}"


def _range(s: Spread | None, digits: int = 1, sign: str = "") -> str:
    if s is None:
        return "-"
    return (
        f"{s['median']:{sign}.{digits}f} [{s['min']:{sign}.{digits}f}..{s['max']:{sign}.{digits}f}]"
    )


def render(plan: OverheadPlan, rows: Sequence[dict[str, Any]], notes: Sequence[str]) -> str:
    out = [*notes]
    for mode in plan.modes:
        mine = [r for r in rows if r["mode"] == mode]
        if not mine:
            continue
        what = (
            f"streamed answers, {plan.chunks} chunks {plan.gap_ms:g} ms apart"
            if mode == "stream"
            else f"whole answers after {1000 * plan.answer_seconds:.0f} ms "
            "(the first chunk is the whole body)"
        )
        out += [
            "",
            f"== {what}; medians over {plan.repeats} repeat(s) [min..max]; "
            "added = the target's less direct's in the same repeat ==",
        ]
        out.append(
            f"{'level':>5} {'target':<14} {'TTFC p50':>8} {'added p50':>22} "
            f"{'TTFC p99':>8} {'added p99':>22} {'gap p50':>7} {'added gap':>9}   (ms)"
        )
        for r in mine:
            out.append(
                f"{r['level']:>5} {r['target']:<14} {_med(r['ttfc_p50'], 2):>8} "
                f"{_range(r['added_ttfc_p50'], 2, '+'):>22} {_med(r['ttfc_p99'], 2):>8} "
                f"{_range(r['added_ttfc_p99'], 1, '+'):>22} {_med(r['gap_p50'], 2):>7} "
                f"{_med(r['added_gap_p50'], 2):>9}"
            )
        out.append("")
        out.append(
            f"{'level':>5} {'target':<14} {'req/s':>7} {'chunks/s':>8} "
            f"{'router CPU ms/request':>22} {'wakes':>5} {'router':>6} {'backend':>7} "
            f"{'load':>5} {'errors':>6}   (CPU: cores busy; wakes: the router's a request)"
        )
        for r in mine:
            out.append(
                f"{r['level']:>5} {r['target']:<14} {_med(r['requests_per_s'], 0):>7} "
                f"{_med(r['chunks_per_s'], 0):>8} "
                f"{_range(r['router_cpu_ms_per_request'], 3):>22} "
                f"{_med(r['router_wakes_per_request'], 1):>5} {_med(r['router_cores'], 2):>6} "
                f"{_med(r['backend_cores'], 2):>7} "
                f"{_med(r['client_cores'], 2):>5} {_med(r['errors'], 0):>6}"
            )
        shares = same_load(mine)
        if shares:
            out += ["", "router CPU per request at the same load on each process:"]
            out += [
                f"{p['level']:>5} {p['target']:<14} over {p['against']} at {p['against_level']}:"
                f" {p['ratio']:.2f}x"
                for p in shares
            ]
    return "\n".join(out)


def command_line(plan: OverheadPlan, out: str | None = None, plot: str | None = None) -> str:
    """The command that runs ``plan`` again, every flag spelled out; files by their names."""

    def joined(values: Sequence[object]) -> str:
        return ",".join(str(v) for v in values) or "none"

    flags = [
        f"--levels {joined(plan.levels)} --workers {joined(plan.workers)}",
        f"--repeats {plan.repeats} --modes {joined(plan.modes)}",
        f"--warmup {plan.warmup:g} --seconds {plan.seconds:g}",
        f"--chunks {plan.chunks} --gap-ms {plan.gap_ms:g} --gateways {joined(plan.gateways)}",
    ]
    if plan.bare_workers != (1,):
        flags.append(f"--bare-workers {joined(plan.bare_workers)}")
    if plan.online_off:
        flags.append("--online-off")
    if plan.aiohttp_front:
        flags.append("--aiohttp-front")
    if plan.one_backend:
        flags.append("--one-backend")
    if plan.lean:
        flags.append("--lean")
    if plan.baseline is not None:
        flags.append(f"--baseline {Path(plan.baseline).name}")
    if plan.router_cores is not None:
        flags.append(f"--router-cores {plan.router_cores}")
    if plan.profile_dir is not None:
        flags.append(
            f"--profile-dir {Path(plan.profile_dir).name} --profile-levels "
            f"{joined(plan.profile_levels)} --profile-seconds {plan.profile_seconds:g} "
            f"--profile-format {plan.profile_format}"
        )
    flags += [
        f"--{what} {Path(path).name}" for what, path in (("out", out), ("plot", plot)) if path
    ]
    return " ".join(["specroute bench overhead", *flags])


def _named(plan: dict[str, Any]) -> dict[str, Any]:
    """The plan with its folders by their names, as its command line gives them: where a
    run was made is not part of what it measured."""
    folders = ("profile_dir", "baseline")
    return plan | {k: Path(plan[k]).name for k in folders if plan.get(k) is not None}


def as_json(
    plan: OverheadPlan,
    ran: dict[str, Any],
    windows: Sequence[Window],
    rows: Sequence[dict[str, Any]],
    notes: Sequence[str],
    command: str = "",
) -> dict[str, Any]:
    return {
        "benchmark": "router_overhead",
        "command": command,
        "date": time.strftime("%Y-%m-%d", time.gmtime()),  # the day it ran, UTC
        "plan": _named(asdict(plan)),
        **ran,
        "notes": list(notes),
        "summary": list(rows),
        "windows": [asdict(w) for w in windows],
    }
