"""The coverage plot: each calibration's 95% interval against the true crossover, and its
backend time against the grid's. Needs matplotlib (the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

COLORS = {"adaptive": "#c2410c", "grid": "#1d4ed8"}


def plot_coverage(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trials = result["trials"]
    hardware = sorted({t["hardware"] for t in trials})
    fig, axes = plt.subplots(len(hardware), 2, figsize=(11, 3.6 * len(hardware)), squeeze=False)
    for row, name in zip(axes, hardware, strict=True):
        mine = [t for t in trials if t["hardware"] == name]
        ax = row[0]
        for i, t in enumerate(mine):
            for method, shift in (("adaptive", -0.15), ("grid", 0.15)):
                outcome = t[method]
                if outcome["value"] is None:
                    continue
                low, high = outcome["ci"]
                top = ax.get_ylim()[1] if high is None else high
                ax.plot(
                    [i + shift] * 2,
                    [low if low is not None else 0, top],
                    color=COLORS[method],
                    linewidth=2,
                    alpha=0.7,
                    label=method if i == 0 else None,
                )
                ax.plot(i + shift, outcome["value"], "o", color=COLORS[method], markersize=3)
        ax.axhline(mine[0]["truth"], color="black", linestyle="--", linewidth=1, label="truth")
        ax.set_title(f"{name}: 95% intervals, calibration by calibration", fontsize=10)
        ax.set_xlabel("calibration")
        ax.set_ylabel("crossover (concurrency)")
        ax.legend(fontsize=8)
        ax = row[1]
        for method in ("adaptive", "grid"):
            seconds = [t[method]["backend_seconds"] for t in mine if t[method]["levels"]]
            ax.hist(seconds, bins=15, color=COLORS[method], alpha=0.6, label=method)
        ax.set_title(f"{name}: backend seconds (virtual)", fontsize=10)
        ax.set_xlabel("modelled seconds of both servers")
        ax.legend(fontsize=8)
    settings = result["settings"]
    fig.suptitle(
        f"coverage of the crossover's interval: noise {settings['noise']}, "
        f"{settings['calibrations']} calibrations",
        fontsize=11,
    )
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
