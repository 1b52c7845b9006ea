"""The crossover plot: per-request and total tok/s of both backends against concurrency,
with 95% bands and the crossovers marked. Needs matplotlib (the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specroute.profiler.report import banded, edge_text, interval_text, measured_when

COLORS = {"spec": "#c2410c", "base": "#1d4ed8"}
LABELS = {"spec": "speculative", "base": "plain"}


def plot_profile(profile: dict[str, Any], path: Path) -> None:
    """A profile with a context axis (v2) is drawn against context (``context_plot``)."""
    if profile.get("context"):
        from specroute.profiler.context_plot import plot_contexts

        plot_contexts(profile, path)
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = profile["levels"]
    x = [row["concurrency"] for row in levels]
    fig, axes = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True)
    panels = (
        ("decode_tps", "per-request decode tok/s", profile["crossover"]),
        ("output_tps", "total output tok/s", profile["throughput_crossover"]),
    )
    ratio = any(banded(c) for _, _, c in panels)  # bands read best as a ratio against 1
    for ax, (key, label, crossover) in zip(axes, panels, strict=True):
        if ratio:
            ax.axhline(1.0, color=COLORS["base"], linewidth=1.5, label=_label(profile, "base"))
            ax.plot(
                x,
                [row["spec"][key]["median"] / row["base"][key]["median"] for row in levels],
                "o-",
                color=COLORS["spec"],
                label=_label(profile, "spec"),
            )
            label = "speculative / plain, " + label.split(" tok/s")[0].removesuffix(" decode")
        for backend in () if ratio else ("spec", "base"):
            mid = [row[backend][key]["median"] for row in levels]
            low = [row[backend][key]["ci"][0] for row in levels]
            high = [row[backend][key]["ci"][1] for row in levels]
            ax.plot(x, mid, "o-", color=COLORS[backend], label=_label(profile, backend))
            ax.fill_between(x, low, high, color=COLORS[backend], alpha=0.2, linewidth=0)
        if banded(crossover):
            _draw_bands(ax, crossover, x)
        elif crossover["value"] is not None:
            ax.axvline(crossover["value"], color="black", linestyle="--", linewidth=1)
            low, high = crossover["ci"]
            span = (x[0] if low is None else low, x[-1] if high is None else high)
            ax.axvspan(*span, color="grey", alpha=0.2, linewidth=0)
            text = f"crossover {crossover['value']:.1f}\n95% {interval_text(crossover['ci'])}"
            _beside(ax, text, crossover["value"], 0.95, x, gap=6, fontsize=9)
        else:
            side = "wins" if crossover["bound"] == "above" else "loses"
            ax.text(
                0.02,
                0.95,
                f"speculation {side} at every level measured",
                transform=ax.transAxes,
                va="top",
                fontsize=9,
            )
        ax.set_ylabel(label)
        ax.grid(True, alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=2, bbox_to_anchor=(0.5, 0.925))
    axes[1].set_xscale("log", base=2)
    axes[1].set_xticks(x, [str(c) for c in x])
    axes[1].set_xlabel("concurrent requests (closed loop)")
    meta = profile["measurement"]
    emulated = (profile["servers"]["spec"].get("emulator") or {}).get("time_scale")
    note = f", emulated at time scale {emulated:g}" if emulated else ""
    when = measured_when(meta)
    fig.suptitle(f"{meta.get('model')}: where speculation pays\n{when}{note}", fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.89))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _draw_bands(ax: Any, crossover: dict[str, Any], x: list[int]) -> None:
    """Where speculation pays shaded green, each edge dashed with its interval in grey."""
    for i, (start, end) in enumerate(crossover["bands"]):
        ax.axvspan(
            x[0] if start is None else start,
            end,
            color="#16a34a",
            alpha=0.12,
            linewidth=0,
            label=None if i else "speculation pays",
        )
    for i, turn in enumerate(crossover.get("crossings", [])):
        ax.axvline(turn["at"], color="black", linestyle="--", linewidth=1)
        if turn.get("ci"):
            ax.axvspan(*turn["ci"], color="grey", alpha=0.15, linewidth=0)
        text = f"{turn['direction']} {edge_text(crossover, turn['at'])}"
        _beside(ax, text, turn["at"], 0.96 - 0.1 * (i % 4), x, gap=4, fontsize=8)


def _beside(
    ax: Any, text: str, at: float, height: float, x: list[int], *, gap: float, fontsize: float
) -> None:
    """A label beside the line at ``at``, ``height`` up the axes, on the side towards the
    log axis' middle so that it stays inside the plot."""
    left = at > (x[0] * x[-1]) ** 0.5
    ax.annotate(
        text,
        (at, height),
        xycoords=("data", "axes fraction"),
        xytext=(-gap if left else gap, 0),
        textcoords="offset points",
        va="top",
        ha="right" if left else "left",
        fontsize=fontsize,
    )


def _label(profile: dict[str, Any], backend: str) -> str:
    """``speculative (EAGLE3)``: with the method the server said it speculates by."""
    method = (profile.get("servers", {}).get(backend) or {}).get("speculative_algorithm")
    return f"{LABELS[backend]} ({method})" if method and backend == "spec" else LABELS[backend]
