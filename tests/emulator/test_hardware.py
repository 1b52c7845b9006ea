from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from specroute.emulator.hardware import Curve, HardwareError, load_hardware, parse_hardware


def test_curve_interpolates_and_extrapolates() -> None:
    curve = Curve.from_table({"1": 10, "3": 20, "5": 40}, "t")
    assert curve(1) == 10
    assert curve(2) == pytest.approx(15)
    assert curve(4) == pytest.approx(30)
    assert curve(7) == pytest.approx(60)  # the last slope beyond the table
    assert curve(0.5) == 10  # never cheaper than the smallest pass measured


def test_measured_h200_tables_are_used_as_measured() -> None:
    hw = load_hardware("llama3.1-8b-h200")
    # target[B=64][q=4] = 15.8975 ms at 1,024 tokens of context per request
    assert hw.forward_ms(64, 4, 64 * 1024) == pytest.approx(15.8975)
    assert hw.forward_ms(16, 1, 16 * 1024) == pytest.approx(6.7761)
    # the attention term: longer context, slower decode, close to the measured 14.13 ms
    assert hw.forward_ms(64, 1, 64 * 4096) == pytest.approx(14.1272, rel=0.05)


def test_speculative_step_costs_more_at_high_batch() -> None:
    for name in ("kimi-k2.5-8x-pcie-fitted", "llama3.1-8b-h100", "llama3.1-8b-h200"):
        hw = load_hardware(name)
        ratios = [hw.speculative_ms(b, 3, b * 1024) / hw.decode_ms(b, b * 1024) for b in (1, 64)]
        assert ratios[1] > ratios[0], name


def test_cuda_graph_limit_slows_large_batches() -> None:
    hw = load_hardware("llama3.1-8b-h200")
    inside = hw.decode_ms(64, 64 * 1024, graph_max_bs=64)
    outside = hw.decode_ms(64, 64 * 1024, graph_max_bs=32)
    assert outside == pytest.approx(inside * hw.eager_factor)


def shipped(name: str) -> dict[str, object]:
    return copy.deepcopy(load_hardware(name).raw)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema": "other"}, "schema"),
        ({"draft_ms": {"1": 1.0}}, "two or more"),
        ({"draft_ms": {"1": -1.0, "2": 1.0}}, "positive"),
        ({"draft_ms": {"a": 1.0, "2": 1.0}}, "numbers"),
        ({"target_ms": {"4": {"4": 1.0, "8": 2.0}}}, "width 1"),
        ({"acceptance": {"accept_length": 7.0}}, "accept_length"),
    ],
)
def test_bad_models_are_refused_with_the_reason(change: dict[str, object], message: str) -> None:
    data = shipped("kimi-k2.5-8x-pcie-fitted") | change
    with pytest.raises(HardwareError, match=message):
        parse_hardware(data)


def test_missing_field_is_named() -> None:
    data = shipped("kimi-k2.5-8x-pcie-fitted")
    del data["prefill_ms"]
    with pytest.raises(HardwareError, match="prefill_ms"):
        parse_hardware(data)


def test_users_pass_their_own_file(tmp_path: Path) -> None:
    data = shipped("llama3.1-8b-h200") | {"name": "mine"}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    assert load_hardware(str(path)).name == "mine"
    with pytest.raises(HardwareError, match="unknown hardware model"):
        load_hardware("no-such-gpu")
    with pytest.raises(HardwareError, match="cannot read"):
        load_hardware(str(tmp_path / "absent.json"))
