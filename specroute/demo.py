"""``specroute demo``: the whole loop on the embedded default, in about two minutes.

Two emulated SGLang servers of one hardware model (one with EAGLE-3), a quick calibration
of where speculation stops paying, the router started with the profile it wrote, and a
load ramp up and down played through it with the ``crossover`` policy and with both static
choices, shown per phase and drawn to a file; then the same ramp replayed offline in
virtual time beside it, with an oracle's gap. Every process it starts is stopped at the end.

Then the other half of the story, in virtual time: the Kimi-K2.5 case study's model rebuilt
from measured mixture-of-experts physics, where speculation does not pay below a crossover
but in a band of medium load (at the case study's accept length), predicted, and a ramp to
128 replayed with the band-aware policy against both static choices and the oracle.
"""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specroute.bench.compare import ComparePlan, compare, render
from specroute.bench.replay import ReplayPlan, compare_offline
from specroute.emulator.predict import Prediction, as_profile, predict, verdict
from specroute.event_loop import run as run_loop
from specroute.loadgen.dataset import synthetic
from specroute.loadgen.spawn import spawned
from specroute.loadgen.sweep import SweepPlan
from specroute.loadgen.trace import named_trace
from specroute.measure import draw
from specroute.model_flags import config_from_flags
from specroute.policies.profile import load_profile, parse_profile, save_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import POOLS
from specroute.profiler.analysis import profile_document
from specroute.profiler.calibration import CalibrationPlan, calibrate
from specroute.profiler.report import interval_text


@dataclass(frozen=True)
class DemoPlan:
    hardware: str = "kimi-k2.5-8x-pcie-fitted"
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
    model = ("--hardware", plan.hardware, "--max-running-requests", "256", *plan.server_flags)
    flags = (*model, "--time-scale", f"{plan.time_scale:g}", "--stream-interval", "4")
    dataset = synthetic(plan.input_len, plan.output_len)
    async with AsyncExitStack() as stack:
        spec = (await stack.enter_async_context(spawned("emulate", "--mode", "spec", *flags))).url
        base = (await stack.enter_async_context(spawned("emulate", "--mode", "base", *flags))).url
        _say(
            f"1/3 two emulated SGLang servers of {plan.hardware} (time scale "
            f"{plan.time_scale:g}): EAGLE-3 at {spec}, plain at {base}"
        )
        _say(
            "2/3 calibrating: closed-loop load at rising concurrency on both, then levels "
            "around the crossover"
        )
        calibration = await calibrate(
            CalibrationPlan(
                SweepPlan(spec, base, dataset, repeats=1),
                max_concurrency=plan.peak,
                budget_seconds=60,
                precision=0.3,
            ),
            plan.out / "sweep",
        )
        document = profile_document(calibration.analysis)
        document["measurement"]["calibration"] = calibration.as_json()
        profile_path = plan.out / "profile.json"
        save_profile(document, profile_path)
        crossover = document["crossover"]
        found = (
            f"{crossover['value']:.1f} (95% {interval_text(crossover['ci'])})"
            if crossover["value"] is not None
            else f"none: speculation {'wins' if crossover['bound'] == 'above' else 'loses'}"
            " at every level"
        )
        _say(f"    crossover {found}; profile written to {profile_path}")
        config = plan.out / "router.toml"
        config.write_text(f'spec = ["{spec}"]\nbase = ["{base}"]\nprofile = "{profile_path}"\n')
        trace = named_trace("ramp", plan.peak, plan.phase_seconds)
        _say(
            f"3/3 a load ramp 1 to {plan.peak} and back ({trace.seconds:.0f} s) through the "
            "router, with the crossover policy and with each static choice"
        )
        results = await compare(ComparePlan(config, trace, dataset), plan.out / "compare")
    replay = ReplayPlan(
        trace,
        dataset,
        {pool: config_from_flags(model, pool, plan.time_scale) for pool in POOLS},
        backends={"spec": (spec,), "base": (base,)},
    )
    profile = load_profile(profile_path)
    offline = compare_offline(
        replay, {name: build_policy(name, {}, profile) for name in results["policies"]}
    )
    _say("")
    _say(render(results))
    (plan.out / "offline.json").write_text(json.dumps(offline, indent=1) + "\n")
    _say("")
    _say(_agreement(results, offline))
    from specroute.bench.compare_plot import plot_compare

    _say("")
    draw(lambda: plot_compare(results, plan.out / "demo.png"), plan.out / "demo.png")
    _say("all servers and routers stopped")
    _say("")
    _bands(plan)
    return results


MOE = "kimi-k2.5-8x-pcie"  # the Kimi-K2.5 case study's model, built from physics
MOE_LEVELS = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128]


def _bands(plan: DemoPlan) -> None:
    """Where speculation pays on the Kimi-K2.5 case study's mixture-of-experts model, at the
    case study's weak drafter and a good one, and the band-aware policy on a ramp to 128,
    all offline."""
    _say(
        f"and in virtual time: {MOE}, the Kimi-K2.5 case study's model built from"
        " mixture-of-experts physics (verifying drafts reads many more experts at low load,"
        " nearly none more at high load)"
    )
    predicted: dict[str, tuple[tuple[str, ...], Prediction]] = {}
    for accept in ("2.1", "3.0"):  # the case study's drafter, and a good one
        model = ("--hardware", MOE, "--accept-length", accept, "--max-running-requests", "256")
        prediction = predict(
            config_from_flags(model, "spec"), MOE_LEVELS, plan.input_len, plan.output_len
        )
        points = [(lv.concurrency, lv.speedup) for lv in prediction.levels]
        _say(f"    accept length {accept}: {verdict(points, 'per-request speed')}")
        predicted[accept] = model, prediction
    weak, prediction = predicted["2.1"]
    configs = {pool: config_from_flags(weak, pool) for pool in POOLS}
    profile = parse_profile(as_profile(prediction, configs["spec"]))
    natural = synthetic(plan.input_len, 2 * plan.output_len)  # ends at EOS: lengths vary
    replay = ReplayPlan(
        named_trace("ramp", 128, 20.0),
        natural,
        configs,
        backends={"spec": ("spec",), "base": ("base",)},
        ignore_eos=False,
    )
    offline = compare_offline(replay, {"crossover": build_policy("crossover", {}, profile)})
    tps = {p: r["overall"]["output_tps"] for p, r in offline["policies"].items()}
    _say(
        f"    accept length 2.1, a ramp 1 to 128 and back, output tok/s: band-aware "
        f"crossover {tps['crossover']:,.0f}, always speculative {tps['always-spec']:,.0f}, "
        f"always plain {tps['always-base']:,.0f}, the oracle {tps['oracle']:,.0f}"
    )


def _agreement(live: dict[str, Any], offline: dict[str, Any]) -> str:
    """The offline replay of the same ramp beside the live run, and the oracle's gap."""
    tps = {
        m: {p: r["overall"]["output_tps"] for p, r in results["policies"].items()}
        for m, results in (("live", live), ("offline", offline))
    }
    pairs = ", ".join(f"{p} {tps['live'][p]:,.0f} / {tps['offline'][p]:,.0f}" for p in tps["live"])
    gap = offline["gap"]["crossover"]
    return (
        f"offline replay of the same ramp in virtual time, tok/s live / offline: {pairs}; "
        f"an oracle knowing each phase's load in advance: {tps['offline']['oracle']:,.0f} "
        f"tok/s (crossover {gap['tpot']:+.1%} median TPOT against it)"
    )


def demo(plan: DemoPlan) -> None:
    run_loop(run_demo(plan))
