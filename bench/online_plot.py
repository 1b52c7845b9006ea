"""The online calibration plot of an offline ``bench compare`` with ``online = "adopt"``:
for each policy that learned, the crossover each fit found in the live traffic with its
interval and the one routed by (the live one once adopted, else the profile's); the
profile's with its interval; and where the speculative server's accept length changed; below, the
trace's load. What it shows is how soon the live estimate leaves a profile gone stale and
settles where the traffic now says."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any


def plot_online(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    learned = {  # the static choices learn too, but route by nothing learned
        name: fits
        for name, fits in results["online_live"].items()
        if not name.startswith("always-")
    }
    profiled = results.get("online_profile") or {}
    value, ci = profiled.get("value"), profiled.get("ci") or (None, None)
    fig, (ax, load_ax) = plt.subplots(
        2, 1, figsize=(11, 6.5), sharex=True, gridspec_kw={"height_ratios": (3, 1)}
    )
    for i, (name, fits) in enumerate(learned.items()):
        colour = f"C{i % 10}"
        times = [float(f[0] or 0.0) for f in fits]
        at = [_finite(f[1]) for f in fits]
        low = [_finite(f[2]) for f in fits]
        high = [_finite(f[3]) for f in fits]
        routed = [value if f[4] is None else _finite(f[4]) for f in fits]
        ax.fill_between(
            times,
            [math.nan if v is None else v for v in low],
            [math.nan if v is None else v for v in high],
            color=colour,
            alpha=0.25,
            step="post",
            label=f"{name}: live interval",
        )
        ax.plot(times, [_nan(v) for v in at], ".", color=colour, label=f"{name}: live crossover")
        ax.step(
            times, [_nan(v) for v in routed], where="post", color=colour, label=f"{name}: routed by"
        )
    if value is not None:
        ax.axhline(value, color="0.3", linestyle="--", label="profile's crossover")
    if ci[0] is not None and ci[1] is not None:
        for edge in ci:
            ax.axhline(edge, color="0.3", linestyle=":", linewidth=0.8)
        ax.plot([], [], color="0.3", linestyle=":", label="profile's interval")
    for change in results.get("accept_schedule") or []:
        for axis in (ax, load_ax):
            axis.axvline(change["at"], color="C3", linestyle=":")
        ax.annotate(
            f"accept length {change['accept_length']:g}",
            (change["at"], 1.0),
            xycoords=("data", "axes fraction"),
            textcoords="offset points",
            xytext=(3, -12),
            fontsize=8,
            color="C3",
        )
    ax.set_yscale("log")
    ax.set_ylabel("crossover (requests)")
    ax.legend(fontsize=8, loc="upper right")
    phases = results["trace"]["phases"]
    edges, loads, elapsed = [], [], 0.0
    for phase in phases:
        edges += [elapsed, elapsed + phase["seconds"]]
        loads += [phase["concurrency"]] * 2
        elapsed += phase["seconds"]
    load_ax.plot(edges, loads, color="0.2")
    load_ax.set_ylabel("load (clients)")
    load_ax.set_xlabel("seconds (virtual)")
    fig.suptitle(f"Online calibration: {results['trace']['name']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else value


def _nan(value: float | None) -> float:
    return math.nan if value is None else value
