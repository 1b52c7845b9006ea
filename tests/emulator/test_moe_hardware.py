"""The two mixture-of-experts hardware models: Kimi-K2.5 built from physics and held to the
the Kimi-K2.5 case study's two figures, Qwen3-30B-A3B as measured; and where speculation pays on each, as the
full engine model (prefill, scheduling, the step loop) predicts it in virtual time."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from importlib import resources

import pytest

from specroute.emulator.hardware import load_hardware
from specroute.emulator.hardware_models import kimi as hardware_kimi
from specroute.emulator.hardware_models import qwen as hardware_qwen
from specroute.emulator.predict import simulate
from tests.emulators import emulator_config

KIMI = "kimi-k2.5-8x-pcie"
QWEN = "qwen3-30b-a3b-h200"


@pytest.mark.parametrize(
    ("name", "generate"), [(KIMI, hardware_kimi.model), (QWEN, hardware_qwen.model)]
)
def test_the_shipped_file_is_what_its_generator_writes(
    name: str, generate: Callable[[], dict[str, object]]
) -> None:
    shipped = resources.files("specroute.emulator.hardware_models").joinpath(f"{name}.json")
    assert shipped.read_text() == json.dumps(generate(), indent=1) + "\n"
    assert load_hardware(name).name == name


def test_kimi_reproduces_the_case_study_at_batch_one() -> None:
    hw = load_hardware(KIMI)
    kv = hw.context_len
    assert 1000 / hw.decode_ms(1, kv) == pytest.approx(90.0, rel=0.01)
    assert 2.1 * 1000 / hw.speculative_ms(1, 3, kv) == pytest.approx(82.3, rel=0.01)
    # over HTTP, one stream: tests/emulator/test_calibration.py reads the model's calibration entries
    assert {(c.mode, c.value, c.accept_length) for c in hw.calibration} == {
        ("base", 90.0, None),
        ("spec", 82.3, 2.1),
    }


def test_kimi_solved_constants_are_physical() -> None:
    solved = hardware_kimi.solve()
    assert solved.target_fixed_ms > 0 and solved.draft_fixed_ms > 0
    # the expert term saturates as the measured layer does: all 384 experts read past ~192
    assert hardware_kimi.experts_ms(256) / hardware_kimi.experts_ms(1) == pytest.approx(
        10.3547 / 0.3699, rel=0.01
    )


def test_qwen_step_times_are_the_measured_ones() -> None:
    hw = load_hardware(QWEN)
    for batch, (decode, verify) in hardware_qwen.TARGET_MS.items():
        kv = batch * hw.context_len
        assert hw.forward_ms(batch, 1, kv) == pytest.approx(decode)
        assert hw.forward_ms(batch, 4, kv) == pytest.approx(verify)
        assert hw.draft(batch) == pytest.approx(hardware_qwen.DRAFT_MS[batch])
        assert hw.draft_extend(4 * batch) == pytest.approx(hardware_qwen.DRAFT_EXTEND_MS[batch])
    # spot checks against the measurement file itself
    assert hw.forward_ms(1, 1, 1024) == pytest.approx(7.0045)
    assert hw.forward_ms(64, 4, 64 * 1024) == pytest.approx(28.8695)
    assert hw.forward_ms(256, 1, 256 * 1024) == pytest.approx(32.8096)
    assert hw.draft(48) == pytest.approx(0.2381)
    assert hw.draft_extend(4 * 128) == pytest.approx(0.5736)


def speedups(name: str, accept: str, concurrency: int, rounds: int = 4) -> tuple[float, float]:
    """(per-request, total) speculative over plain, as ``specroute emulate --predict``."""
    config = emulator_config(
        "--hardware", name, "--accept-length", accept, "--max-running-requests", "512"
    )
    base = simulate(replace(config, mode="base"), concurrency, 512, 256, rounds)
    spec = simulate(replace(config, mode="spec"), concurrency, 512, 256, rounds)
    return spec.per_request / base.per_request, spec.total / base.total


def test_kimi_at_the_case_study_accept_length_pays_in_a_band_per_request_only() -> None:
    """Loses at low load, pays a little in the middle, loses again above ~290; total
    throughput never clearly pays (the prefill, all-reduce bound, is the same cost in
    both modes)."""
    low = speedups(KIMI, "2.1", 8)
    middle, high = (speedups(KIMI, "2.1", c, rounds=1) for c in (96, 384))  # short windows
    assert low[0] < 0.85 and low[1] < 0.85
    assert 1.02 < middle[0] < 1.10 and middle[1] < 1.0
    assert high[0] < 0.98 and high[1] < 0.96


def test_kimi_with_the_better_drafter_pays_everywhere_with_a_dip() -> None:
    hw = load_hardware(KIMI)
    one = 3.0 * hw.decode_ms(1, 1024) / hw.speculative_ms(1, 3, 1024)
    dip = speedups(KIMI, "3.0", 8)
    assert one > 1.25 and 1.0 < dip[0] < one and dip[1] > 1.0


def test_qwen_as_measured_loses_only_at_low_load_when_acceptance_is_poor() -> None:
    dip, peak = speedups(QWEN, "1.6", 4), speedups(QWEN, "1.6", 48)
    assert dip[0] < 0.9 and dip[1] < 0.9
    assert peak[0] > 1.2 and peak[1] > 1.2
    at_dip, _ = speedups(QWEN, "2.1", 4)
    assert 1.0 < at_dip < 1.15
