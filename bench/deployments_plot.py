"""The deployments plot: each contender's figures against the utilisation, a panel a figure,
the oracle dashed, the live runs as crosses over the offline lines. Needs matplotlib (the
``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specroute.bench.deployments import COLUMNS, ORACLE

COLORS = {
    "plain": "#475569",
    "eagle": "#1d4ed8",
    "adaptive": "#0891b2",
    "adaptive-calibrated": "#15803d",
    "specroute": "#c2410c",
    "specroute-adaptive": "#a21caf",
    ORACLE: "#000000",
}
_LOG = {"ttft_ms_p50", "ttft_ms_p99", "tpot_ms_p99"}


def plot_deployments(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = document["utilisations"]
    shares = [float(u) for u in rows]
    fig, axes = plt.subplots(2, 3, figsize=(13, 7))
    for ax, (key, label) in zip(axes.flat, COLUMNS, strict=True):
        for name in [*document["contenders"], ORACLE]:
            values = [rows[u][name][key] for u in rows]
            style = "--" if name == ORACLE else "-"
            ax.plot(shares, values, style, marker="o", markersize=3, color=COLORS[name], label=name)
            live = [(float(u), r["live"][name][key]) for u, r in rows.items() if "live" in r]
            if live:
                ax.plot(*zip(*live, strict=True), "x", color=COLORS[name], markersize=8)
        ax.set_title(
            label if key in ("output_tps", "goodput_rps") else f"{label} (ms)", fontsize=10
        )
        ax.set_xlabel("utilisation")
        if key in _LOG:
            ax.set_yscale("log")
        ax.grid(alpha=0.3)
    axes.flat[0].legend(fontsize=7)
    trace = document["trace"]
    fig.suptitle(
        f"{document['hardware']}, {document['topology']}: {trace['name']} "
        f"(x: live on emulated servers); SLO {document['slo']}",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=100)
    plt.close(fig)
