"""The comparison plot: the trace's load and each policy's share of requests sent to the
speculative server over time, and each policy's median TPOT per phase. Phases that name
their prompts' length are labelled with it; TPOTs far apart (short and long prompts) are
drawn on a log scale. Beside them, each policy over the whole trace: its p99 TPOT against
its median (the mean of its phases' medians, as the gap to the oracle counts it), with its
output tokens a second, so that a policy better on both lies below and left of another."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from specroute.loadgen.trace import prompt_label

_BIN_SECONDS = 1.0
_DASHES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")


def plot_compare(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = results["trace"]["phases"]
    ends = np.cumsum([p["seconds"] for p in phases])
    starts = ends - np.array([p["seconds"] for p in phases])
    fig = plt.figure(figsize=(13, 7))
    grid = fig.add_gridspec(2, 2, width_ratios=(2.2, 1))
    load_ax = fig.add_subplot(grid[0, 0])
    tpot_ax = fig.add_subplot(grid[1, 0], sharex=load_ax)
    load_ax.tick_params(labelbottom=False)
    whole_ax = fig.add_subplot(grid[:, 1])
    traced = _draw_load(load_ax, phases, starts, ends)
    style = _styles([*results["timeline"], *results["policies"]])
    _draw_shares(load_ax.twinx(), results["timeline"], ends[-1], style)
    _draw_tpots(tpot_ax, results["policies"], (starts + ends) / 2, style)
    _draw_whole(whole_ax, results["policies"], style)
    fig.suptitle(f"Policies head to head: {results['trace']['name']}")
    handles, labels = tpot_ax.get_legend_handles_labels()
    fig.legend([*traced, *handles], ["load", *labels], loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.015 + 0.025 * math.ceil((len(labels) + 1) / 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _styles(policies: list[str]) -> dict[str, dict[str, Any]]:
    """One colour, dash and marker per policy on every panel, so that policies routed alike
    still show, and more than ten apart."""
    return {
        name: {
            "color": f"C{i % 10}",
            "linestyle": _DASHES[i % len(_DASHES)],
            "marker": _MARKERS[i % len(_MARKERS)],
        }
        for i, name in enumerate(dict.fromkeys(policies))
    }


def _draw_load(ax: Any, phases: list[dict[str, Any]], starts: Any, ends: Any) -> Any:
    """The trace's load, each phase that names its prompts' length labelled above it;
    returns the line, for the legend."""
    rates = any(p.get("rate") is not None for p in phases)
    load = [p["rate"] if p.get("rate") is not None else p["concurrency"] for p in phases]
    traced = ax.step([0, *ends], [load[0], *load], where="pre", color="black")
    ax.set_ylabel("requests per second" if rates else "concurrent requests")
    for start, end, phase in zip(starts, ends, phases, strict=True):
        if phase.get("input_len"):
            ax.annotate(
                f"{prompt_label(phase['input_len'])} tok",
                ((start + end) / 2, 1.0),
                ha="center",
                va="bottom",
                fontsize=8,
                xycoords=("data", "axes fraction"),
            )
    ax.set_ylim(0, max(load) * 1.15)  # the load from zero, the prompt labels above
    return traced


def _draw_shares(
    ax: Any, timeline: dict[str, Any], seconds: float, style: dict[str, dict[str, Any]]
) -> None:
    """Each policy's share of requests sent to the speculative server, second by second."""
    bins = np.arange(0, seconds + _BIN_SECONDS, _BIN_SECONDS)
    for policy, points in timeline.items():
        if not points:
            continue
        t = np.array([p[0] for p in points])
        spec = np.array([p[1].startswith("spec") for p in points], dtype=float)
        count, _ = np.histogram(t, bins)
        hits, _ = np.histogram(t, bins, weights=spec)
        share = np.divide(hits, count, out=np.full_like(hits, np.nan), where=count > 0)
        line = style[policy] | {"marker": None}
        ax.plot(bins[:-1] + _BIN_SECONDS / 2, share, alpha=0.8, **line)
    ax.set_ylabel("share sent to the speculative server")
    ax.set_ylim(-0.05, 1.05)


def _draw_tpots(
    ax: Any, policies: dict[str, Any], mids: Any, style: dict[str, dict[str, Any]]
) -> None:
    """Each policy's median TPOT per phase; on a log scale when they lie far apart."""
    from matplotlib.ticker import FormatStrFormatter

    drawn: list[float] = []
    for policy, data in policies.items():
        tpot = [
            row["tpot_ms_p50"] if row["tpot_ms_p50"] is not None else np.nan
            for row in data["phases"]
        ]
        ax.plot(mids, tpot, label=policy, **style[policy])
        drawn += [t for t in tpot if not np.isnan(t)]
    if drawn and min(drawn) > 0 and max(drawn) / min(drawn) > 4:
        ax.set_yscale("log")
        for axis in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
            axis(FormatStrFormatter("%g"))
    ax.set_ylabel("median TPOT per phase, ms")
    ax.set_xlabel("seconds")
    ax.grid(True, alpha=0.3)


def _draw_whole(ax: Any, policies: dict[str, Any], style: dict[str, dict[str, Any]]) -> None:
    """Each policy over the whole trace: p99 against median TPOT, labelled with its output
    tokens a second."""
    dots: list[tuple[float, float, float, str]] = []  # median, p99, tok/s, policy
    for policy, data in policies.items():
        row = data["overall"]
        median, p99 = row.get("tpot_ms_p50_phases"), row["tpot_ms_p99"]
        if median is not None and p99 is not None:
            dots.append((median, p99, row["output_tps"], policy))
    span = [max(1e-9, max(v) - min(v)) for v in ([d[0] for d in dots], [d[1] for d in dots]) if v]
    labelled: list[tuple[float, float]] = []
    for median, p99, tps, policy in dots:
        ax.plot([median], [p99], markersize=8, **(style[policy] | {"linestyle": "none"}))
        # a label that would sit on an earlier one goes below its point instead
        crowded = any(
            abs(median - x) < 0.08 * span[0] and abs(p99 - y) < 0.05 * span[1] for x, y in labelled
        )
        ax.annotate(
            f"{tps:,.0f}",
            (median, p99),
            textcoords="offset points",
            xytext=(5, -11 if crowded else 4),
            fontsize=7,
        )
        labelled.append((median, p99))
    ax.set_xlabel("median TPOT, mean over the phases, ms")
    ax.set_ylabel("p99 TPOT, ms")
    ax.set_title("whole trace (labels: output tok/s)", fontsize=9)
    ax.grid(True, alpha=0.3)
