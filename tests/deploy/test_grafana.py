"""deploy/grafana/: the committed dashboard is what its generator writes, and every query
reads a metric that exists.

A name exists when the router or the emulated SGLang server exports it (both started for
the test, as ``tests/deploy/test_deploy.py`` does for the alerts) or a recording rule of
``deploy/prometheus/rules.yml`` writes it; ``FROM_THE_PLATFORM`` names the few that come
from outside either, each with its source.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.exported_metrics import exported, metric_names, recorded, scrape

GRAFANA = Path(__file__).resolve().parents[2] / "deploy" / "grafana"
SCRIPT = GRAFANA / "dashboard.py"
DASHBOARD = GRAFANA / "specroute.json"
FROM_THE_PLATFORM: set[str] = set()  # metrics a panel reads from outside the project


def panels() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(DASHBOARD.read_text())["panels"]
    return [p for p in found if p["type"] != "row"]


def test_there_is_something_to_check() -> None:
    titles = " ".join(p["title"] for p in panels()).lower()
    for subject in (
        "crossover",
        "pool",
        "first token",
        "per output token",
        "accept length",
        "health",
        "cpu",
        "upstream errors",
        "ejections",
        "live crossover",
        "peer samples",
        "peer errors",
        "another drafter",
    ):
        assert subject in titles, subject


@pytest.mark.skipif(
    importlib.util.find_spec("grafana_foundation_sdk") is None,
    reason="grafana-foundation-sdk is not installed: pip install -e '.[dev]'",
)
def test_the_committed_dashboard_is_the_generators() -> None:
    run = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stdout == DASHBOARD.read_text(), (
        f"regenerate it: python {SCRIPT.relative_to(GRAFANA.parents[1])} > "
        f"{DASHBOARD.relative_to(GRAFANA.parents[1])}"
    )


def test_every_panel_reads_the_prometheus_variable() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    (variable,) = dashboard["templating"]["list"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": f"${{{variable['name']}}}"}
        assert panel["targets"] and all(t["expr"] for t in panel["targets"]), panel["title"]


async def test_every_query_reads_an_existing_metric(tmp_path: Path) -> None:
    pages = await scrape(tmp_path)
    known = set().union(*map(exported, pages)) | recorded() | FROM_THE_PLATFORM
    read = set()
    for panel in panels():
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, f"{panel['title']}: no metric in {target['expr']}"
            missing = names - known
            assert not missing, f"{panel['title']} reads {sorted(missing)}"
            read |= names
    assert read >= FROM_THE_PLATFORM, "a name allowed for nothing"
