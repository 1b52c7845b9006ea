"""Tables of ``bench compare`` results (its ``compare.json``): each policy's figures over
the trace, live and offline side by side, per phase, and per prompt length."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from docsgen.markdown import code, number, table

# (key in a policy's overall figures, column heading)
_FIGURES = (
    ("tpot_ms_p50_phases", "TPOT p50 per phase, ms"),
    ("tpot_ms_p99", "TPOT p99, ms"),
    ("output_tps", "output tok/s"),
    ("spec_share", "speculative share"),
)


def _share(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _cell(key: str, value: float | None) -> str:
    return _share(value) if key == "spec_share" else number(value, 3 if "ms" in key else 0)


def compare_table(runs: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """One row per policy; for each run (``label``, its results) its figures over the
    trace, and where it is offline, the gap to the oracle."""
    policies = list(dict.fromkeys(p for _, results in runs for p in results["policies"]))
    header = ["policy"]
    for label, results in runs:
        header += [f"{label}: {heading}" for _, heading in _FIGURES]
        if "gap" in results:
            header.append(f"{label}: gap to the oracle, TPOT / tok/s")
    rows = []
    for policy in policies:
        row = [code(policy)]
        for _, results in runs:
            overall = results["policies"].get(policy, {}).get("overall", {})
            row += [_cell(key, overall.get(key)) for key, _ in _FIGURES]
            if "gap" in results:
                gap = results["gap"].get(policy)
                row.append(
                    "" if gap is None else f"{_pct(gap['tpot'])} / {_pct(gap['output_tps'])}"
                )
        rows.append(row)
    return table(header, rows, "l" + "r" * (len(header) - 1))


def phases_table(results: dict[str, Any]) -> str:
    """Per phase: its load and prompts, and each policy's median TPOT (speculative share)."""
    policies = list(results["policies"])
    header = ["phase", "load", "prompts", *(code(p) for p in policies)]
    rows = []
    for i, phase in enumerate(results["trace"]["phases"]):
        load = f"{phase['rate']:g}/s" if phase.get("rate") is not None else phase["concurrency"]
        prompts = phase.get("input_len") or ["dataset"]
        shown = ", ".join(str(n) for n in dict.fromkeys(prompts))
        cells = []
        for p in policies:
            row = results["policies"][p]["phases"][i]
            cells.append(f"{number(row['tpot_ms_p50'], 3)} ({_share(row['spec_share'])})")
        rows.append([str(i + 1), str(load), shown, *cells])
    return table(header, rows, "rrl" + "r" * len(policies))


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
