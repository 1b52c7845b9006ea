"""The coverage benchmark, short: calibrations of noisy emulated servers in virtual time
against the noise-free engine's crossover, beside a fixed grid. The full figures (50
calibrations) are in the README; this checks the machinery and that a handful hold."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specroute.bench.coverage import CoveragePlan, coverage, render
from specroute.bench.coverage_plot import plot_coverage
from specroute.loadgen.dataset import synthetic
from tests.emulators import emulator_config


def test_short_coverage(tmp_path: Path) -> None:
    configs = tuple(
        emulator_config("--hardware", name, "--max-running-requests", "128", "--noise", "default")
        for name in ("llama3.1-8b-h200", "kimi-k2.5-8x-pcie-fitted")
    )
    plan = CoveragePlan(configs, synthetic(512, 32), calibrations=3, output_len=32, grid_every=2)
    result = coverage(plan)  # llama, kimi, llama: the grid beside llama's second
    summary = result["summary"]
    assert summary["overall"]["calibrations"] == 3
    assert {"kimi-k2.5-8x-pcie-fitted", "llama3.1-8b-h200"} <= set(summary)
    assert summary["overall"]["adaptive"]["coverage"] >= 2 / 3
    assert summary["overall"]["grid"]["runs"] == 1
    for trial in result["trials"]:
        assert trial["truth"] > 0 and trial["adaptive"]["backend_seconds"] > 0
        if trial["hardware"] == "llama3.1-8b-h200":  # a crossover near 69: past 64, found
            assert max(trial["adaptive"]["levels"]) > 64 and None not in trial["adaptive"]["ci"]
    table = render(result)
    assert table.count("\n") == 4 and "coverage" in table
    json.dumps(result)
    pytest.importorskip("matplotlib")
    plot_coverage(result, tmp_path / "coverage.png")
    assert (tmp_path / "coverage.png").read_bytes()[:4] == b"\x89PNG"
