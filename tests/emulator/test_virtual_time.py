"""The one virtual-time driver gives what each of its users gave before it was one: the
ground truth, a virtual sweep, the offline comparison and the coverage study, to the bit
(``tests/virtual_time_cases.py`` says how the figures were recorded)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.virtual_time_cases import CASES

RECORDED = json.loads((Path(__file__).parents[1] / "data" / "virtual-time.json").read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_the_driver_gives_the_recorded_figures(name: str) -> None:
    case: Callable[[], dict[str, Any]] = CASES[name]
    assert json.loads(json.dumps(case())) == RECORDED[name]
