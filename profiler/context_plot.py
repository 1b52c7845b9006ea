"""The crossover against context, for a profile with a context axis (``v2``): per request
and in total, each bucket's crossover with its 95% interval, the load where speculation
pays shaded. Needs matplotlib (the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specroute.profiler.report import banded, measured_when

PAYS = "#16a34a"
EDGE = "#111827"


def plot_contexts(profile: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    buckets = profile["context"]["buckets"]
    x = [b["context"] for b in buckets]
    levels = [lvl for b in buckets for lvl in b.get("levels") or []]
    top = max(levels, default=max(_ends(buckets)) * 2)
    bottom = min(levels, default=1)
    panels = [("crossover", "per-request speed (TPOT)")]
    if all(b.get("throughput_crossover") for b in buckets):
        panels.append(("throughput_crossover", "total throughput"))
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(8, 3.6 * len(panels) + 1), sharex=True, squeeze=False
    )
    for ax, (key, label) in zip(axes[:, 0], panels, strict=True):
        _panel(ax, [b[key] for b in buckets], x, bottom, top)
        ax.set_title(label, fontsize=10, loc="left")
        ax.set_ylabel("concurrent requests")
        ax.set_yscale("log", base=2)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_ylim(bottom / 1.3, top * 1.3)
        ax.grid(True, alpha=0.3, which="both")
    low = axes[-1, 0]
    low.set_xscale("log", base=2)
    low.set_xlim(x[0] / 1.6, x[-1] * 1.6)
    low.set_xticks(x, [f"{c:,.0f}" for c in x])
    low.set_xlabel("context: mean KV tokens per request while decoding (prompt + output/2)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=3, bbox_to_anchor=(0.5, 0.93))
    meta = profile["measurement"]
    fig.suptitle(
        f"{meta.get('model') or meta.get('hardware')}: where speculation pays, by "
        f"context\n{measured_when(meta)}",
        fontsize=11,
    )
    fig.subplots_adjust(left=0.11, right=0.96, bottom=0.08, top=0.84, hspace=0.22)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _ends(buckets: list[dict[str, Any]]) -> list[float]:
    return [e for b in buckets for band in b["crossover"]["bands"] for e in band if e] or [1.0]


def _panel(
    ax: Any, crossovers: list[dict[str, Any]], x: list[float], bottom: float, top: float
) -> None:
    """Each bucket's paying load as a green bar, its crossover (or, with bands, each edge)
    as a point with its interval (an open end drawn to the axis' edge), the one-crossover
    buckets joined as the profile is read between them."""
    named: set[str] = set()

    def once(label: str) -> str | None:
        first = label not in named
        named.add(label)
        return label if first else None

    for c, at in zip(crossovers, x, strict=True):
        for start, end in c["bands"]:
            low, high = bottom if start is None else start, top if end is None else end
            ax.vlines(
                at, low, high, colors=PAYS, linewidth=16, alpha=0.25, label=once("speculation pays")
            )
        if banded(c):
            marks = [(t["at"], t.get("ci")) for t in c.get("crossings", [])]
        elif c["value"] is not None:
            marks = [(c["value"], c["ci"])]
        else:
            up = c["bound"] == "above"
            ax.plot([at], [c["limit"]], "^" if up else "v", color=EDGE, markersize=7)
            _note(ax, at, c["limit"], f"{'above' if up else 'below'} {c['limit']:g}")
            marks = []
        for value, ci in marks:
            low, high = ci or (None, None)
            low, high = bottom if low is None else low, top if high is None else high
            ax.errorbar(
                [at],
                [value],
                yerr=[[value - low], [high - value]],
                fmt="o",
                color=EDGE,
                capsize=4,
                markersize=5,
                label=once("crossover, 95% interval"),
            )
            _note(ax, at, value, f"{value:.1f}")
    single = [
        (at, c["value"])
        for c, at in zip(crossovers, x, strict=True)
        if c["value"] is not None and not banded(c)
    ]
    if len(single) > 1:
        xs, ys = zip(*single, strict=True)
        ax.plot(xs, ys, "--", color=EDGE, linewidth=1, alpha=0.6, label=once("between contexts"))


def _note(ax: Any, at: float, value: float, text: str) -> None:
    ax.annotate(
        text, (at, value), xytext=(9, 0), textcoords="offset points", va="center", fontsize=8
    )
