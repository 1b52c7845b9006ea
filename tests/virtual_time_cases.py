"""What the engine model gives in virtual time, in each of the places that drive it: the
ground truth (``--predict``), a virtual sweep's runs, the offline comparison (a trace
replayed through policies, with the oracle) and the coverage study.

``tests/data/virtual-time.json`` holds these figures as the drivers gave them before they
became one (``python -m tests.virtual_time_cases > tests/data/virtual-time.json``);
``tests/emulator/test_virtual_time.py`` checks that the one driver gives them still, to the bit.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from specroute.bench.coverage import CoveragePlan, coverage
from specroute.bench.replay import ReplayPlan, compare_offline
from specroute.emulator.config import EmulatorConfig
from specroute.emulator.predict import as_json, as_profile, predict
from specroute.loadgen.dataset import synthetic
from specroute.loadgen.sweep import SweepPlan
from specroute.loadgen.trace import Phase, Trace
from specroute.loadgen.virtual_sweep import VirtualSweep
from specroute.policies.profile import parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import Pool
from tests.emulators import emulator_config

DENSE = ("--hardware", "llama3.1-8b-h200", "--max-running-requests", "256")
KIMI = ("--hardware", "kimi-k2.5-8x-pcie", "--accept-length", "2.1")


def predicted() -> dict[str, Any]:
    """``--predict`` of a dense model with one crossover and of the MoE model's band."""
    dense = predict(emulator_config(*DENSE), [1, 8, 32, 96], 128, 64)
    moe = predict(emulator_config(*KIMI, "--max-running-requests", "128"), [1, 16, 48], 256, 64)
    return {"dense": as_json(dense), "moe": as_json(moe)}


def swept() -> dict[str, Any]:
    """A virtual sweep's runs, every request's record, with noise on."""
    config = emulator_config(*DENSE, "--noise", "default")
    plan = SweepPlan("virtual", "virtual", synthetic(128, 64), repeats=2, requests=24)

    async def sweep(out: Path) -> list[dict[str, Any]]:
        async with VirtualSweep(plan, out, config, input_len=128, output_len=64, seed=3) as s:
            runs = [
                await s.run_one(b, level, r)
                for level in (4, 16)
                for r in (0, 1)
                for b in ("spec", "base")
            ]
        return [
            {
                "t0": run.t0,
                "t1": run.t1,
                "accept_length": run.accept_length,
                "records": [asdict(record) for record in run.records],
                "seconds": seconds,
            }
            for run, seconds in runs
        ]

    with tempfile.TemporaryDirectory() as out:
        return {"runs": asyncio.run(sweep(Path(out)))}


def replayed() -> dict[str, Any]:
    """A ramp replayed through two policies, the static choices and the oracle, on servers
    that share their GPUs and on servers of their own."""
    servers: dict[Pool, EmulatorConfig] = {
        pool: emulator_config("--mode", pool, *DENSE, "--time-scale", "0.1")
        for pool in ("spec", "base")
    }
    profile = parse_profile(
        as_profile(predict(servers["base"], [1, 16, 48, 96], 128, 64), servers["base"])
    )
    trace = Trace("ramp", (Phase(2.0, 4), Phase(2.0, 48), Phase(2.0, 96), Phase(2.0, 8)))
    policies = {name: build_policy(name, {}, profile) for name in ("crossover", "expected-latency")}
    figures: dict[str, Any] = {}
    for topology, share in (("own", None), ("shared", "0")):
        plan = ReplayPlan(
            trace,
            synthetic(128, 64),
            {pool: replace(config, share_gpus=share) for pool, config in servers.items()},
            backends={"spec": ("http://spec:1",), "base": ("http://base:2",)},
        )
        results = compare_offline(plan, policies)
        results["timeline"] = {name: digest(t) for name, t in results["timeline"].items()}
        figures[topology] = results
    return figures


def digest(value: object) -> dict[str, object]:
    """A long list kept as its length and a hash of its JSON: equal to the bit or not."""
    text = json.dumps(value, sort_keys=True)
    return {
        "items": len(value) if isinstance(value, list) else None,
        "sha256": hashlib.sha256(text.encode()).hexdigest(),
    }


def covered() -> dict[str, Any]:
    """A short coverage study: noisy calibrations against the noise-free truth."""
    configs = (
        emulator_config(
            "--hardware", "llama3.1-8b-h200", "--max-running-requests", "128", "--noise", "default"
        ),
    )
    plan = CoveragePlan(configs, synthetic(512, 32), calibrations=1, output_len=32, grid_every=1)
    result = coverage(plan)
    del result["wall_seconds"]  # the machine's time, not the model's
    for trial in result["trials"]:
        del trial["wall_seconds"]
    return result


CASES = {"predicted": predicted, "swept": swept, "replayed": replayed, "covered": covered}


def main() -> None:
    json.dump({name: case() for name, case in CASES.items()}, sys.stdout, indent=1)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
