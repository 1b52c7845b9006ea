"""Tables of ``bench compare`` results (its ``compare.json``): each policy's figures over
the trace, live and offline side by side, per phase, and per prompt length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from docsgen.markdown import code, number, table
from specroute.bench.compare import phase_lags
from specroute.loadgen import lag

# (key in a policy's overall figures, column heading)
_FIGURES = (
    ("tpot_ms_p50_phases", "TPOT p50 per phase, ms"),
    ("tpot_ms_p99", "TPOT p99, ms"),
    ("output_tps", "output tok/s"),
    ("spec_share", "speculative share"),
)
_LATE = (
    f"the emulated servers fell more than {lag.LIMIT:.0%} behind their time scale in this "
    "run or one of its phases, so its figures are the machine's, not the model's."
)


def _share(value: float | None, form: str = ".0%") -> str:
    return "-" if value is None else f"{value:{form}}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _cell(key: str, value: float | None) -> str:
    return _share(value) if key == "spec_share" else number(value, 3 if "ms" in key else 0)


def _lag(figures: dict[str, Any]) -> str:
    """A policy's lag over its run, and its worst phase's where that one fell further
    behind (what flags a run as not having kept its time may be one phase)."""
    whole = figures.get("emulator_lag")
    worst = max(phase_lags(figures), default=None)
    if worst is None or whole is None or worst <= whole:
        return lag.shown(whole)
    return f"{lag.shown(whole)} (a phase {lag.shown(worst)})"


def compare_table(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """For each run (``label``, its results), one row per policy with its figures over the
    trace; where the run is offline, the gap to the oracle; where it is live, how far the
    emulated servers fell behind their time scale (over the run, and in its worst phase where
    that one fell further), with a warning if past the limit, and the share of a request's
    time spent elsewhere than in them (where read)."""
    parts = []
    for label, results in runs:
        header = ["policy", *(heading for _, heading in _FIGURES)]
        offline = "gap" in results
        timed = "kept_time" in results  # live, its servers' clocks read
        if offline:
            header.append("gap to the oracle: TPOT / tok/s")
        away = timed and any("elsewhere" in p for p in results["policies"].values())
        if timed:
            header.append("emulator lag")
        if away:
            header.append("time elsewhere")
        rows = []
        for policy, figures in results["policies"].items():
            overall = figures.get("overall", {})
            row = [code(policy), *(_cell(key, overall.get(key)) for key, _ in _FIGURES)]
            if offline:
                gap = results["gap"].get(policy)
                row.append(
                    "" if gap is None else f"{_pct(gap['tpot'])} / {_pct(gap['output_tps'])}"
                )
            if timed:
                row.append(_lag(figures))
            if away:
                row.append(_share(figures.get("elsewhere"), ".1%"))
            rows.append(row)
        if len(runs) > 1:
            parts.append(f"**{label.capitalize()}**\n")
        parts.append(table(header, rows, "l" + "r" * (len(header) - 1)))
        if results.get("kept_time") is False:
            parts.append(f"\n**Not kept time**: {_LATE}\n")
    return "\n".join(parts)


def phases_table(results: dict[str, Any]) -> str:
    """Per phase: its load and prompts, and each policy's median TPOT (speculative share)."""
    policies = list(results["policies"])
    phases = results["trace"]["phases"]
    named = any(phase.get("input_len") for phase in phases)  # a column only if some say
    header = ["phase", "load", *(["prompts"] if named else []), *(code(p) for p in policies)]
    rows = []
    for i, phase in enumerate(phases):
        load = f"{phase['rate']:g}/s" if phase.get("rate") is not None else phase["concurrency"]
        prompts = ", ".join(str(n) for n in dict.fromkeys(phase.get("input_len") or ["-"]))
        cells = []
        for p in policies:
            row = results["policies"][p]["phases"][i]
            cells.append(f"{number(row['tpot_ms_p50'], 3)} ({_share(row['spec_share'])})")
        rows.append([str(i + 1), str(load), *([prompts] if named else []), *cells])
    return table(header, rows, "rr" + ("l" if named else "") + "r" * len(policies))


def prompts_table(results: dict[str, Any]) -> str:
    """Per prompt length of the trace, each policy's median and p99 TPOT and requests."""
    policies = list(results["policies"])
    lengths = list(results["policies"][policies[0]].get("prompts", {}))
    header = ["policy"]
    for n in lengths:
        header += [f"{n}-token prompts: TPOT p50, ms", "p99, ms", "requests"]
    rows = []
    for p in policies:
        row = [code(p)]
        for n in lengths:
            figures = results["policies"][p]["prompts"][n]
            row += [
                number(figures["tpot_ms_p50"], 3),
                number(figures["tpot_ms_p99"], 3),
                str(figures["requests"]),
            ]
        rows.append(row)
    return table(header, rows, "l" + "r" * (len(header) - 1))
