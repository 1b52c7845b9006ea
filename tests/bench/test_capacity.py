"""``specroute bench capacity``'s measurement: a short real run against an emulator
process, and the verdict on made-up levels."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specroute.bench.capacity import LevelResult, verdict
from specroute.cli import main


def test_a_short_run_from_the_command_line_is_sustained_with_every_number_filled_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "capacity.json"
    argv = [
        "bench",
        "capacity",
        "--levels",
        "1,4",
        "--seconds-per-level",
        "1.5",
        "--max-tokens",
        "32",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert said.count("level ") >= 2 and "chunks/s" in said  # a line per level, then the table
    document = json.loads(out.read_text())
    results = [LevelResult(**r) for r in document["results"]]
    assert [r.level for r in results] == [1, 4]
    for r in results:
        assert r.ramped and r.errors == 0
        assert r.seconds == pytest.approx(1.5, abs=0.1)
        assert r.streams == pytest.approx(r.level, abs=0.5)
        assert r.lag is not None and math.isfinite(r.lag) and abs(r.lag) < 0.05
        assert r.steps > 0 and r.step_ms is not None and r.step_ms > 0
        assert r.chunks > 0 and r.tokens >= r.chunks  # a speculative chunk carries several
        assert r.tokens_per_s == pytest.approx(r.tokens / r.seconds)
        assert r.emulator_cpu is not None and 0 < r.emulator_cpu < 2
        assert 0 < r.client_cpu < 2
    assert verdict(results).startswith("sustained: all levels up to 4 streams")
    assert document["sustained_streams"] == 4 and document["crossing"]["bound"] == "above"
    assert document["verdict"] in said


def _level(level: int, lag: float | None, ramped: bool = True) -> LevelResult:
    return LevelResult(level, errors=0, ramped=ramped, lag=lag)


@pytest.mark.parametrize(
    ("lags", "expected"),
    [
        ({1: 0.01, 2: 0.02}, "sustained: all levels up to 2 streams within 5% lag (no crossing)"),
        ({1: 0.01, 4: 0.09}, "sustained: 1 streams within 5% lag; lag passes 5% near 2 streams"),
        ({1: 0.06, 2: 0.09}, "lag reaches 5% already at the lowest level (1)"),
        ({1: 0.01, 2: None}, "sustained: 1 streams within 5% lag; level 2: no step finished"),
        ({1: None}, "level 1: no step finished in its window"),
    ],
)
def test_verdict(lags: dict[int, float | None], expected: str) -> None:
    assert verdict([_level(n, lag) for n, lag in lags.items()]).startswith(expected)


def test_a_level_that_never_ramped_says_so() -> None:
    assert "did not all start within the warm-up" in verdict([_level(8, None, ramped=False)])
