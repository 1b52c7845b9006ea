"""``specroute demo``: the whole loop on the embedded default, in about two minutes.

Two emulated SGLang servers of one hardware model (one with EAGLE-3), a quick calibration
of where speculation stops paying, the router started with the profile it wrote, and a
load ramp up and down played through it with the ``crossover`` policy and with both static
choices, shown per phase and drawn to a file. Every process it starts is stopped at the end.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

from bench.compare import ComparePlan, compare, render
from bench.dataset import synthetic
from bench.spawn import spawned
from bench.sweep import SweepPlan
from bench.trace import named_trace
from policies.profile import save_profile
from profiler.analysis import profile_document
from profiler.calibration import CalibrationPlan, calibrate
from specroute.measure import draw


@dataclass(frozen=True)
class DemoPlan:
    hardware: str = "kimi-k2.5-8x-pcie"
    time_scale: float = 0.1
    peak: int = 16
    phase_seconds: float = 3.0
    input_len: int = 128
    output_len: int = 128
    out: Path = Path("specroute-demo")
    server_flags: tuple[str, ...] = ()  # more ``specroute emulate`` flags for both servers


def _say(text: str) -> None:
    print(text, flush=True)


async def run_demo(plan: DemoPlan) -> dict[str, object]:
    plan.out.mkdir(parents=True, exist_ok=True)
    flags = (
        "--hardware", plan.hardware, "--time-scale", f"{plan.time_scale:g}",
        "--max-running-requests", "256", "--stream-interval", "4", *plan.server_flags,
    )  # fmt: skip
    dataset = synthetic(plan.input_len, plan.output_len)
    async with AsyncExitStack() as stack:
        spec = await stack.enter_async_context(spawned("emulate", "--mode", "spec", *flags))
        base = await stack.enter_async_context(spawned("emulate", "--mode", "base", *flags))
        _say(f"1/3 two emulated SGLang servers of {plan.hardware} (time scale "
             f"{plan.time_scale:g}): EAGLE-3 at {spec}, plain at {base}")  # fmt: skip
        _say("2/3 calibrating: closed-loop load at rising concurrency on both, then levels "
             "around the crossover")  # fmt: skip
        calibration = await calibrate(
            CalibrationPlan(SweepPlan(spec, base, dataset, repeats=1),
                            max_concurrency=plan.peak, budget_seconds=60, precision=0.3),
            plan.out / "sweep",
        )  # fmt: skip
        document = profile_document(calibration.analysis)
        document["measurement"]["calibration"] = calibration.as_json()
        profile_path = plan.out / "profile.json"
        save_profile(document, profile_path)
        crossover = document["crossover"]
        found = (f"{crossover['value']:.1f} (95% {crossover['ci'][0]:.1f} to "
                 f"{crossover['ci'][1]:.1f})" if crossover["value"] is not None
                 else f"none: speculation {'wins' if crossover['bound'] == 'above' else 'loses'}"
                 " at every level")  # fmt: skip
        _say(f"    crossover {found}; profile written to {profile_path}")
        config = plan.out / "router.toml"
        config.write_text(f'spec = ["{spec}"]\nbase = ["{base}"]\nprofile = "{profile_path}"\n')
        trace = named_trace("ramp", plan.peak, plan.phase_seconds)
        _say(f"3/3 a load ramp 1 to {plan.peak} and back ({trace.seconds:.0f} s) through the "
             "router, with the crossover policy and with each static choice")  # fmt: skip
        results = await compare(ComparePlan(config, trace, dataset), plan.out / "compare")
    _say("")
    _say(render(results))
    from bench.compare_plot import plot_compare

    _say("")
    draw(lambda: plot_compare(results, plan.out / "demo.png"), plan.out / "demo.png")
    _say("all servers and routers stopped")
    return results


def demo(plan: DemoPlan) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(run_demo(plan))
        return
    uvloop.run(run_demo(plan))
