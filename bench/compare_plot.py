"""The comparison plot: the trace's load and each policy's share of requests sent to the
speculative server over time, and each policy's median TPOT per phase. Phases that name
their prompts' length are labelled with it; TPOTs far apart (short and long prompts) are
drawn on a log scale."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from specroute.bench.trace import prompt_label

_BIN_SECONDS = 1.0
_DASHES = ("-", "--", "-.", ":")


def plot_compare(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    phases = results["trace"]["phases"]
    ends = np.cumsum([p["seconds"] for p in phases])
    starts = ends - np.array([p["seconds"] for p in phases])
    fig, (load_ax, tpot_ax) = plt.subplots(2, 1, figsize=(9, 7), sharex=True)
    rates = any(p.get("rate") is not None for p in phases)
    load = [p["rate"] if p.get("rate") is not None else p["concurrency"] for p in phases]
    traced = load_ax.step([0, *ends], [load[0], *load], where="pre", color="black")
    load_ax.set_ylabel("requests per second" if rates else "concurrent requests")
    for start, end, phase in zip(starts, ends, phases, strict=True):
        if phase.get("input_len"):
            load_ax.annotate(f"{prompt_label(phase['input_len'])} tok", ((start + end) / 2, 1.0),
                             ha="center", va="bottom", fontsize=8,
                             xycoords=("data", "axes fraction"))  # fmt: skip
    load_ax.set_ylim(0, max(load) * 1.15)  # the load from zero, the prompt labels above
    share_ax = load_ax.twinx()
    bins = np.arange(0, ends[-1] + _BIN_SECONDS, _BIN_SECONDS)
    # one colour and dash per policy on both panels, so that lines routed alike still show
    names = list(dict.fromkeys([*results["timeline"], *results["policies"]]))
    style = {name: {"color": f"C{i % 10}", "linestyle": _DASHES[i % len(_DASHES)]}
             for i, name in enumerate(names)}  # fmt: skip
    for policy, points in results["timeline"].items():
        if not points:
            continue
        t = np.array([p[0] for p in points])
        spec = np.array([p[1].startswith("spec") for p in points], dtype=float)
        count, _ = np.histogram(t, bins)
        hits, _ = np.histogram(t, bins, weights=spec)
        share = np.divide(hits, count, out=np.full_like(hits, np.nan), where=count > 0)
        share_ax.plot(bins[:-1] + _BIN_SECONDS / 2, share, alpha=0.8, **style[policy])
    share_ax.set_ylabel("share sent to the speculative server")
    share_ax.set_ylim(-0.05, 1.05)
    mids = (starts + ends) / 2
    drawn: list[float] = []
    for policy, data in results["policies"].items():
        tpot = [row["tpot_ms_p50"] if row["tpot_ms_p50"] is not None else np.nan
                for row in data["phases"]]  # fmt: skip
        tpot_ax.plot(mids, tpot, marker="o", label=policy, **style[policy])
        drawn += [t for t in tpot if not np.isnan(t)]
    if drawn and min(drawn) > 0 and max(drawn) / min(drawn) > 4:
        tpot_ax.set_yscale("log")
        for axis in (tpot_ax.yaxis.set_major_formatter, tpot_ax.yaxis.set_minor_formatter):
            axis(FormatStrFormatter("%g"))
    tpot_ax.set_ylabel("median TPOT per phase, ms")
    tpot_ax.set_xlabel("seconds")
    tpot_ax.grid(True, alpha=0.3)
    fig.suptitle(f"Policies head to head: {results['trace']['name']}")
    handles, labels = tpot_ax.get_legend_handles_labels()
    fig.legend([*traced, *handles], ["load", *labels], loc="lower center", ncol=3, fontsize=8)
    fig.tight_layout(rect=(0, 0.015 + 0.025 * math.ceil((len(labels) + 1) / 3), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
