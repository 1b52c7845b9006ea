"""The emulator's timing noise: off by default, seeded, a multiplier per run and per step."""

from __future__ import annotations

import statistics

import pytest

from specroute.emulator.engine import Engine, Sequence
from specroute.emulator.noise import Noise, NoiseError, parse_noise
from tests.emulators import emulator_config


def _run_durations(engine: Engine, runs: int = 3, tokens: int = 40) -> list[list[float]]:
    """Step times of ``runs`` runs of one request each, the engine idle in between."""
    out = []
    for run in range(runs):
        engine.submit(Sequence(f"r{run}", "a prompt", 64, tokens, ignore_eos=True))
        steps = []
        while (step := engine.step()) is not None:
            steps.append(step.duration)
        out.append(steps)
    return out


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("off", Noise()),
        ("default", Noise(0.02, 0.05)),
        ("run=0.1", Noise(0.1, 0.0)),
        ("run=0.05,step=0.1", Noise(0.05, 0.1)),
    ],
)
def test_parse(text: str, expected: Noise) -> None:
    assert parse_noise(text) == expected


@pytest.mark.parametrize("text", ["jitter=0.1", "run=x", "step=2"])
def test_bad_settings_name_the_key(text: str) -> None:
    with pytest.raises(NoiseError, match="noise"):
        parse_noise(text)


def test_off_by_default_and_seeded() -> None:
    quiet = _run_durations(emulator_config("--hardware", "llama3.1-8b-h100").engine())
    assert len({tuple(r[1:]) for r in quiet}) == 1  # every run alike
    flags = ("--hardware", "llama3.1-8b-h100", "--noise", "run=0.05,step=0.1")
    noisy = _run_durations(emulator_config(*flags).engine())
    assert noisy == _run_durations(emulator_config(*flags).engine())  # the same seed
    assert noisy != _run_durations(emulator_config(*flags, "--seed", "1").engine())
    assert noisy != quiet


def test_a_run_shares_its_multiplier_and_steps_jitter_around_it() -> None:
    flags = ("--hardware", "llama3.1-8b-h100", "--mode", "base")
    quiet = _run_durations(emulator_config(*flags).engine(), runs=1, tokens=200)[0]
    per_run = _run_durations(
        emulator_config(*flags, "--noise", "run=0.1").engine(), runs=6, tokens=200
    )
    ratios = [{round(n / q, 9) for n, q in zip(run[1:], quiet[1:], strict=True)} for run in per_run]
    assert all(len(r) == 1 for r in ratios)  # one multiplier through a run
    assert len({r.pop() for r in ratios}) == 6  # a new one each run
    jittered = _run_durations(
        emulator_config(*flags, "--noise", "step=0.1").engine(), runs=1, tokens=200
    )[0]
    steps = [n / q for n, q in zip(jittered[1:], quiet[1:], strict=True)]
    assert statistics.mean(steps) == pytest.approx(1.0, abs=0.03)
    assert 0.07 < statistics.stdev(steps) < 0.13
