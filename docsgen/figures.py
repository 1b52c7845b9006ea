"""Draw every results figure from its committed JSON with the project's own plots:
``python -m docsgen.figures`` (needs matplotlib, in the ``dev`` extra). The figures are
committed beside the pages (docs/figures/) so the README can show them too."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from docsgen.runs import FIGURES, RUNS
from specroute.bench.compare_plot import plot_compare
from specroute.bench.coverage_plot import plot_coverage
from specroute.bench.deployments_plot import plot_deployments
from specroute.bench.online_plot import plot_online
from specroute.bench.overhead_plot import plot_overhead, plot_overhead_shares
from specroute.profiler.plot import plot_profile

PLOTS: dict[str, Callable[[dict[str, Any], Path], None]] = {
    "profile": plot_profile,
    "coverage": plot_coverage,
    "compare": plot_compare,
    "overhead": plot_overhead,
    "overhead-shares": plot_overhead_shares,
    "online": plot_online,
    "deployments": plot_deployments,
}


def draw(name: str) -> Path:
    run = RUNS[name]
    if run.figure is None or run.plot is None:
        raise ValueError(f"run {name!r} has no figure")
    path = FIGURES / run.figure
    PLOTS[run.plot](json.loads(run.data(name).read_text()), path)
    return path


def main(names: list[str]) -> int:
    FIGURES.mkdir(parents=True, exist_ok=True)
    for name in names or [n for n, r in RUNS.items() if r.figure]:
        print(f"{draw(name).relative_to(FIGURES.parents[1])} from {name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
