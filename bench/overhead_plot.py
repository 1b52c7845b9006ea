"""The overhead plot, a row per mode: each target's added time to first chunk (median over
the repeats, the range as a band) and its router's CPU per request, by concurrency."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def plot_overhead(document: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows: Sequence[dict[str, Any]] = document["summary"]
    modes = [m for m in document["plan"]["modes"] if any(r["mode"] == m for r in rows)]
    targets = [t for t in document["targets"] if t != "direct"]
    fig, axes = plt.subplots(len(modes), 2, figsize=(11, 3.8 * len(modes)), squeeze=False)
    for (added_ax, cpu_ax), mode in zip(axes, modes, strict=True):
        for target in targets:
            mine = [r for r in rows if r["mode"] == mode and r["target"] == target]
            for ax, key in ((added_ax, "added_ttfc_p50"), (cpu_ax, "router_cpu_ms_per_request")):
                points = [(r["level"], r[key]) for r in mine if r[key] is not None]
                if not points:
                    continue
                levels = [level for level, _ in points]
                (line,) = ax.plot(levels, [s["median"] for _, s in points], "o-", label=target)
                ax.fill_between(
                    levels,
                    [s["min"] for _, s in points],
                    [s["max"] for _, s in points],
                    color=line.get_color(),
                    alpha=0.15,
                )
        what = "streamed" if mode == "stream" else "whole answers"
        added_ax.set_title(f"{what}: added time to first chunk (vs direct)")
        added_ax.set_ylabel("ms (symlog)")
        added_ax.set_yscale("symlog", linthresh=1.0)
        cpu_ax.set_title(f"{what}: router CPU per request")
        cpu_ax.set_ylabel("CPU ms per request")
        levels = sorted({r["level"] for r in rows})
        for ax in (added_ax, cpu_ax):
            _levels(ax, levels, "concurrent requests")
    _save(fig, f"What a router adds on loopback ({document['machine']})", path)


def plot_overhead_shares(document: dict[str, Any], path: Path) -> None:
    """A panel per mode: each Python router's CPU per request by the requests in flight on
    each of its processes (the level over its process count), so that several processes
    that cost what one costs at its share of the load lie on one's line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from specroute.bench.overhead_targets import counted

    rows: Sequence[dict[str, Any]] = document["summary"]
    modes = [m for m in document["plan"]["modes"] if any(r["mode"] == m for r in rows)]
    targets = {t: c[1] for t in document["targets"] if (c := counted(t)) is not None}
    fig, axes = plt.subplots(1, len(modes), figsize=(5.5 * len(modes), 3.8), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        for target, count in targets.items():
            points = sorted(
                (r["level"] / count, r["router_cpu_ms_per_request"]["median"])
                for r in rows
                if r["mode"] == mode and r["target"] == target and r["router_cpu_ms_per_request"]
            )
            ax.plot(*zip(*points, strict=True), "o-" if count == 1 else "s--", label=target)
        what = "streamed" if mode == "stream" else "whole answers"
        ax.set_title(f"{what}: router CPU per request")
        ax.set_ylabel("CPU ms per request")
        shares = {r["level"] / targets[r["target"]] for r in rows if r["target"] in targets}
        _levels(ax, sorted(shares), "requests in flight on each process (level / processes)")
    _save(fig, f"The same load on each process ({document['machine']})", path)


def _levels(ax: Any, levels: Sequence[float], label: str) -> None:
    """A concurrency axis, by powers of two, each level named; the grid and the legend."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [f"{level:g}" for level in levels])
    ax.minorticks_off()
    ax.set_xlabel(label)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)


def _save(fig: Any, title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
