"""The crossover plot: per-request and total tok/s of both backends against concurrency,
with 95% bands and the crossovers marked. Needs matplotlib (the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specroute.profiler.report import interval_text

COLORS = {"spec": "#c2410c", "base": "#1d4ed8"}
LABELS = {"spec": "speculative", "base": "plain"}


def plot_profile(profile: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = profile["levels"]
    x = [row["concurrency"] for row in levels]
    fig, axes = plt.subplots(2, 1, figsize=(8, 7.5), sharex=True)
    panels = (("decode_tps", "per-request decode tok/s", profile["crossover"]),
              ("output_tps", "total output tok/s", profile["throughput_crossover"]))  # fmt: skip
    for ax, (key, label, crossover) in zip(axes, panels, strict=True):
        for backend in ("spec", "base"):
            mid = [row[backend][key]["median"] for row in levels]
            low = [row[backend][key]["ci"][0] for row in levels]
            high = [row[backend][key]["ci"][1] for row in levels]
            ax.plot(x, mid, "o-", color=COLORS[backend], label=_label(profile, backend))
            ax.fill_between(x, low, high, color=COLORS[backend], alpha=0.2, linewidth=0)
        if crossover["value"] is not None:
            ax.axvline(crossover["value"], color="black", linestyle="--", linewidth=1)
            low, high = crossover["ci"]
            span = (x[0] if low is None else low, x[-1] if high is None else high)
            ax.axvspan(*span, color="grey", alpha=0.2, linewidth=0)
            left = crossover["value"] > (x[0] * x[-1]) ** 0.5  # the log axis' middle
            ax.annotate(
                f"crossover {crossover['value']:.1f}\n95% {interval_text(crossover['ci'])}",
                (crossover["value"], 0.95), xycoords=("data", "axes fraction"),
                xytext=(-6 if left else 6, 0), textcoords="offset points", va="top",
                ha="right" if left else "left", fontsize=9,
            )  # fmt: skip
        else:
            side = "wins" if crossover["bound"] == "above" else "loses"
            ax.text(0.02, 0.95, f"speculation {side} at every level measured",
                    transform=ax.transAxes, va="top", fontsize=9)  # fmt: skip
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
    fig.suptitle(f"{meta.get('model')}: where speculation stops paying\n"
                 f"measured {meta.get('started')}{note}", fontsize=11)  # fmt: skip
    fig.tight_layout(rect=(0, 0, 1, 0.89))
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _label(profile: dict[str, Any], backend: str) -> str:
    """``speculative (EAGLE3)``: with the method the server said it speculates by."""
    method = (profile.get("servers", {}).get(backend) or {}).get("speculative_algorithm")
    return f"{LABELS[backend]} ({method})" if method and backend == "spec" else LABELS[backend]
