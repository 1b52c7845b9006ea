"""``specroute bench``: each benchmark a sub-command with its handler. Heavy modules load
only in the handler that needs them."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specroute.emulator.hardware import load_hardware
from specroute.event_loop import run as run_loop
from specroute.flags import add_dataset_flags, add_workload_flags, dataset, levels, slo, sweep_plan
from specroute.measure import draw
from specroute.model_flags import add_model_flags, emulator_config, given_model_flags, positive

if TYPE_CHECKING:
    from collections.abc import Callable

    from specroute.bench.convergence import Converged
    from specroute.bench.learning import Learning
    from specroute.flags import Subcommands
    from specroute.loadgen.lag import Kept
    from specroute.loadgen.request_trace import RequestTrace
    from specroute.loadgen.trace import Trace
    from specroute.policies.profile import Profile
    from specroute.router.settings import RouterSettings


def add_bench(sub: Subcommands) -> None:
    bench = sub.add_parser(
        "bench",
        help="measure backends and the router: sweep, compare, capacity, overhead",
        description="Benchmarks, each a command of its own.",
    )
    commands = bench.add_subparsers(dest="bench_command", required=True)
    for add in (
        _add_sweep,
        _add_compare,
        _add_capacity,
        _add_overhead,
        _add_calls,
        _add_replicas,
        _add_affinity,
        _add_deployments,
        _add_convergence,
        _add_chaos,
        _add_soak,
        _add_coverage,
    ):
        add(commands)


def _counts(
    p: argparse.ArgumentParser, flag: str, default: list[int], help: str | None = None
) -> None:
    """A comma-separated list of counts (levels, workers, replicas)."""
    p.add_argument(flag, type=levels, default=default, metavar="N1,N2,...", help=help)


def _duration(
    p: argparse.ArgumentParser, flag: str, default: float, help: str | None = None
) -> None:
    p.add_argument(flag, type=positive(float), default=default, metavar="S", help=help)


def _clients(p: argparse.ArgumentParser, *, requests: int, concurrency: int) -> None:
    """How many mixed requests, from how many closed-loop clients, through one router."""
    p.add_argument("--requests", type=positive(int), default=requests)
    p.add_argument("--concurrency", type=positive(int), default=concurrency)


def _time_scale(p: argparse.ArgumentParser, default: float, help: str | None = None) -> None:
    p.add_argument("--time-scale", type=positive(float), default=default, metavar="F", help=help)


def _add_sweep(commands: Subcommands) -> None:
    sweep = commands.add_parser(
        "sweep",
        help="both backends across concurrency levels, kept raw in a folder",
        description="Closed-loop load at each level, both backends interleaved.",
    )
    add_workload_flags(sweep)
    sweep.add_argument("--concurrency", type=levels, default=[1, 2, 4, 8, 16, 32, 64])
    sweep.add_argument("--out", required=True, metavar="DIR")
    sweep.set_defaults(handler=_sweep)


def _add_compare(commands: Subcommands) -> None:
    compare = commands.add_parser(
        "compare",
        help="the same time-varying load through the router, one policy at a time",
        description="Each policy in turn through router processes from one config, per phase; "
        "with --offline, the trace replayed in virtual time, with an oracle's gap.",
    )
    compare.add_argument(
        "--router-config",
        metavar="FILE.toml",
        help="the router's settings: spec, base, profile, ...",
    )
    compare.add_argument(
        "--profile", metavar="FILE", help="--offline: the profile to route by, over the config's"
    )
    _add_trace_flags(compare)
    compare.add_argument(
        "--offline",
        action="store_true",
        help="no servers: replay the trace in virtual time through the emulator's engine "
        "model (the flags below) and report the gap to an oracle",
    )
    add_model_flags(compare, seed=False)
    _time_scale(compare, 1.0, "--offline: the emulated servers' time scale")
    compare.add_argument(
        "--policies",
        default="crossover,always-spec,always-base",
        help="comma-separated, run in this order; NAME:KEY=VALUE[:...] "
        "sets a policy's parameters (crossover:crossover=21)",
    )
    add_dataset_flags(compare)
    compare.add_argument("--out", required=True, metavar="DIR")
    compare.add_argument("--plot", metavar="compare.png")
    compare.add_argument(
        "--online-plot",
        metavar="online.png",
        help='offline, with online = "adopt" in the router\'s config: the live crossover '
        "of each fit with its interval beside the profile's, over the trace",
    )
    compare.set_defaults(handler=_compare)


def _add_trace_flags(compare: argparse.ArgumentParser) -> None:
    """The time-varying load a comparison plays."""
    compare.add_argument(
        "--trace",
        default="ramp",
        help="ramp, steps, poisson-day or a JSON file of phases (each may "
        "name its prompts' input_len)",
    )
    compare.add_argument(
        "--peak",
        type=int,
        default=16,
        help="ramp and steps: top concurrency; poisson-day: the busiest "
        "hour's requests per second unless --peak-rate",
    )
    compare.add_argument(
        "--peak-rate",
        type=float,
        metavar="REQ_PER_S",
        help="poisson-day: the busiest hour's requests per second",
    )
    compare.add_argument("--phase-seconds", type=float, default=20.0)
    compare.add_argument(
        "--settle",
        type=float,
        default=0.0,
        metavar="S",
        help="leave each phase's first S seconds (the load changing) out of its figures",
    )


def _add_capacity(commands: Subcommands) -> None:
    cap = commands.add_parser(
        "capacity",
        help="how many concurrent streams one emulator process serves in real time",
        description="Closed-loop streams at rising levels against one emulated server, and "
        "the level at which its lag (slept over modelled step time) passes 5%%.",
    )
    cap.add_argument(
        "--hardware",
        default="kimi-k2.5-8x-pcie-fitted",
        help="a shipped hardware model or a JSON file",
    )
    cap.add_argument("--mode", choices=["spec", "base"], default="spec")
    _counts(cap, "--levels", [16, 32, 64, 128, 256, 512], "concurrent streams per level")
    _duration(cap, "--seconds-per-level", 8.0, "the measured window per level")
    _duration(cap, "--warmup", 20.0, "at most this long for every stream's first token")
    cap.add_argument("--max-tokens", type=positive(int), default=256)
    _time_scale(cap, 1.0)
    cap.add_argument("--out", metavar="FILE.json", help="every number as JSON")
    cap.set_defaults(handler=_capacity)


def _add_overhead(commands: Subcommands) -> None:
    overhead = commands.add_parser(
        "overhead",
        help="what a router adds: direct, a bare proxy, specroute, SGLang's gateways",
        description="Two stub SGLang backends on loopback and, in front of them in turn: "
        "nothing, a bare Python pass-through, specroute serve (one target per --workers "
        "count) and the gateways in Rust that --gateways names, each when installed (smg: "
        "pip install 'specroute[overhead]'). "
        "Closed-loop load at each level, the targets interleaved and repeated; per level "
        "and target the time to first chunk, the gaps between chunks, throughput and the "
        "CPU the router used per request, and what each adds over direct.",
    )
    _counts(overhead, "--levels", [1, 4, 16, 64, 256, 512], "concurrent requests per level")
    _counts(overhead, "--workers", [1, 2], "specroute serve --workers, one target each")
    _counts(
        overhead,
        "--bare-workers",
        [1],
        "the bare pass-through's processes, one target each (bare-wN above 1)",
    )
    _add_overhead_targets(overhead)
    overhead.add_argument("--repeats", type=positive(int), default=3)
    overhead.add_argument(
        "--modes",
        type=_modes,
        default=["stream", "whole"],
        metavar="M1,M2",
        help="stream, whole (unstreamed answers) or both",
    )
    _duration(overhead, "--warmup", 0.75, "load before each window, at its concurrency")
    _duration(overhead, "--seconds", 1.5, "each measured window")
    overhead.add_argument("--chunks", type=positive(int), default=16, help="chunks per answer")
    overhead.add_argument(
        "--gap-ms",
        type=positive(float),
        default=20.0,
        metavar="MS",
        help="the backends' pause between chunks",
    )
    overhead.add_argument(
        "--gateways",
        type=_gateways,
        default=["smg"],
        metavar="G1,G2",
        help="the gateways in Rust to compare against, each when installed: smg, "
        "sglang-router, both, or none",
    )
    overhead.add_argument(
        "--router-cores",
        type=positive(int),
        metavar="N",
        help="pinned (4 cores or more): each router's cores; default the largest --workers",
    )
    _add_overhead_profiles(overhead)
    overhead.add_argument(
        "--quick", action="store_true", help="a smoke test: levels 1,16, one repeat, short windows"
    )
    overhead.add_argument("--out", metavar="FILE.json", help="every window and the summary")
    overhead.add_argument("--plot", metavar="FILE.png", help="needs matplotlib")
    overhead.set_defaults(handler=_overhead)


def _add_calls(commands: Subcommands) -> None:
    calls = commands.add_parser(
        "calls",
        help="the Python calls a request costs the router, this code against another version",
        description="specroute serve (one worker) under cProfile in front of the overhead "
        "bench's stub backends, this code and the specroute in --baseline DIR in turn, "
        "each run with N and 2N requests: a request's calls are the difference over N. "
        "Where the CPU per request of bench overhead moves by several percent between "
        "windows, the count is the same for the same code path.",
    )
    calls.add_argument(
        "--baseline",
        required=True,
        metavar="DIR",
        help="another specroute, installed there (pip install --target DIR --no-deps)",
    )
    calls.add_argument("--requests", type=positive(int), default=2000, metavar="N")
    calls.add_argument("--concurrency", type=positive(int), default=64)
    calls.add_argument(
        "--modes",
        type=lambda v: tuple(v.split(",")),
        default=("stream", "whole"),
        metavar="M1,M2",
        help="stream, whole (chat completions streamed, or answered whole)",
    )
    calls.add_argument("--out", metavar="FILE.json")
    calls.set_defaults(handler=_calls)


def _calls(args: argparse.Namespace) -> int:
    from specroute.bench.call_count import CallPlan, count_calls, render

    plan = CallPlan(args.baseline, args.requests, args.concurrency, args.modes)
    document = run_loop(count_calls(plan, _note))
    print(render(document))
    _save(document, args.out)
    return 0


def _add_overhead_targets(p: argparse.ArgumentParser) -> None:
    """The targets measured beside the default ones, each for what one part costs."""
    p.add_argument(
        "--online-off",
        action="store_true",
        help="also specroute-w1-online-off: one worker with --online off, beside the "
        "default (observe), for what online calibration costs",
    )
    p.add_argument(
        "--aiohttp-front",
        action="store_true",
        help="also specroute-w1-aiohttp: one worker with --front aiohttp, beside the default "
        "(the router's own front), for what the own front saves",
    )
    p.add_argument(
        "--one-backend",
        action="store_true",
        help="also specroute-wN-one-backend for each worker count: every request on one of "
        "the two stub backends, as the bench sent them before specroute-wN spread them over "
        "both as direct and the gateways do",
    )
    p.add_argument(
        "--baseline",
        metavar="DIR",
        help="also specroute-wN-baseline for each worker count: the router of another "
        "specroute version, installed in DIR (pip install --target DIR --no-deps "
        "specroute-VERSION.whl), measured in turns with this one, for what a change costs",
    )
    p.add_argument(
        "--lean",
        action="store_true",
        help="also lean: the pass-through on a bare asyncio protocol (llhttp) and the "
        "router's own upstream client, beside bare (aiohttp's server and client), for what "
        "aiohttp's server side costs a request",
    )


def _add_overhead_profiles(p: argparse.ArgumentParser) -> None:
    """The profiled windows after the measured ones."""
    p.add_argument(
        "--profile-dir",
        metavar="DIR",
        help="after the measured windows, one window more per Python router, mode and "
        "--profile-levels level, py-spy recording the router's workers into DIR",
    )
    _counts(p, "--profile-levels", [256], "the levels to profile, among --levels")
    _duration(p, "--profile-seconds", 5.0, "each profiled window")
    p.add_argument(
        "--profile-format",
        choices=["speedscope", "flamegraph", "raw"],
        default="speedscope",
        help="py-spy's: speedscope JSON, a flame graph SVG or collapsed stacks (text)",
    )


def _add_replicas(commands: Subcommands) -> None:
    replicas = commands.add_parser(
        "replicas",
        help="several router replicas against one router: the speculative share",
        description="Emulated servers, then one router and several replicas in front of them "
        "in turn under the same ramp; how far the replicas' share of speculative requests "
        "strays from one router's, by load source, replicas and poll interval.",
    )
    _counts(replicas, "--replicas", [2, 4])
    replicas.add_argument(
        "--polls",
        type=_seconds,
        default=[0.05, 0.25, 1.0],
        metavar="S1,S2",
        help="poll intervals of the replicas load source",
    )
    _duration(replicas, "--seconds", 2.0, "at each level of the ramp")
    _time_scale(replicas, 1.0, "the emulated servers'")
    replicas.add_argument("--out", metavar="FILE.json")
    replicas.set_defaults(handler=_replicas)


def _add_affinity(commands: Subcommands) -> None:
    affinity = commands.add_parser(
        "affinity",
        help="placement within a pool: least load against prefix affinity, chats that share "
        "system prompts",
        description="Two speculative and two plain emulated servers with radix caches, a "
        "router routing by the crossover, and the same chats (a few system prompts, a "
        "question each) with each placement on fresh servers: cache hit rate, time to first "
        "token, the speculative share, and how many system prompts prefix affinity's hash "
        "gave each speculative server.",
    )
    affinity.add_argument("--requests", type=positive(int), default=400)
    affinity.add_argument(
        "--rate",
        type=positive(float),
        default=5.0,
        help="requests a second of modelled time, arriving as a Poisson process",
    )
    affinity.add_argument("--system-prompts", type=positive(int), default=8)
    affinity.add_argument(
        "--cache-tokens",
        type=positive(int),
        default=5000,
        help="each server's radix cache, in tokens (default: about four system prompts)",
    )
    _time_scale(affinity, 0.2)
    affinity.add_argument("--out", metavar="FILE.json")
    affinity.set_defaults(handler=_affinity)


def _add_deployments(commands: Subcommands) -> None:
    deployments = commands.add_parser(
        "deployments",
        help="what a team could deploy instead, head to head with specroute: one server "
        "plain, EAGLE-3, or adaptive; the routed pair; on production traffic, in virtual time",
        description="On one GPU group, each of: a plain server, an EAGLE-3 server at its "
        "fixed depth, an adaptive one (SGLang's default schedule, and the schedule written "
        "from the profile), each with all of the memory; and specroute over a speculative and "
        "a plain server sharing the GPUs and splitting the memory (--topology partitioned: two "
        "groups, each deployment twice, and specroute also over two adaptive servers). The "
        "same requests each time, open loop, at rates that put the GPUs at each "
        "--utilisation, in virtual time, and live on emulated servers behind a router at "
        "each --live one; beside them an oracle made of the plain and EAGLE-3 runs. Every KV "
        "cache sized from memory as SGLang's; the profile is the emulator's prediction at the "
        "trace's mean lengths.",
    )
    add_model_flags(deployments)
    deployments.add_argument(
        "--traffic",
        choices=["azure", "ramp", "day"],
        default="azure",
        help="azure: the window of the Azure LLM inference trace 2023 (conversation half) as "
        "it came; ramp, day: its requests arriving at a rate doubling up to a peak and back, "
        "or following a day's hours, the utilisation stated at the busiest phase "
        "(default: %(default)s)",
    )
    deployments.add_argument(
        "--window",
        default="600+600",
        metavar="START+SECONDS",
        help="the part of the trace replayed, in its own seconds (default: %(default)s)",
    )
    deployments.add_argument(
        "--utilisation",
        type=_shares,
        default=[0.25, 0.5, 0.75, 0.9, 1.0, 1.2],
        metavar="U1,U2,...",
        help="offered output tokens a second over what the plain server delivers saturated",
    )
    deployments.add_argument(
        "--topology",
        choices=["shared", "partitioned"],
        default="shared",
        help="shared: one GPU group, the pair on it; partitioned: two, each one-server "
        "deployment twice behind least-load placement, the pair on a group each",
    )
    deployments.add_argument(
        "--live",
        type=_shares,
        default=[],
        metavar="U1,...",
        help="these utilisations also live: each contender's servers as emulator processes, "
        "a router in front, the requests sent by their arrival times",
    )
    _time_scale(deployments, 0.1, "--live: the emulated servers'")
    deployments.add_argument("--slo", type=slo, default={"ttft": 2.0, "tpot": 0.05})
    deployments.add_argument("--out", metavar="FILE.json")
    deployments.add_argument("--plot", metavar="FILE.png", help="the figures; needs matplotlib")
    deployments.set_defaults(handler=_deployments)


def _shares(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"each must be positive, got {text!r}")
    return values


def _add_chaos(commands: Subcommands) -> None:
    chaos = commands.add_parser(
        "chaos",
        help="mixed traffic through one router while backends are killed, stalled, cut",
        description="A router process in front of emulator processes that a schedule drawn "
        "from the seed kills, starts again and injects faults into, while clients send mixed "
        "requests and cancel some; every request must be accounted for, and the router's "
        "counters must agree with the clients'. Exits 1 when a check fails.",
    )
    _clients(chaos, requests=3000, concurrency=16)
    chaos.add_argument("--seed", type=int, default=0, help="the requests and the schedule")
    chaos.add_argument("--spec-backends", type=positive(int), default=2)
    chaos.add_argument("--base-backends", type=positive(int), default=2)
    chaos.add_argument(
        "--events",
        type=int,
        metavar="N",
        help="kills and fault changes (default: one per 150 requests)",
    )
    _time_scale(chaos, 0.1)
    chaos.add_argument("--out", metavar="FILE.json", help="the tally, counters and events")
    chaos.set_defaults(handler=_chaos)


def _add_soak(commands: Subcommands) -> None:
    soak = commands.add_parser(
        "soak",
        help="a long run through one router, watching its memory and descriptors",
        description="Mixed requests through a router process in front of two fast emulators; "
        "every --every requests the router's RSS, descriptors, connections, threads and "
        "in-flight gauges, and once more after the client left and --idle seconds passed. "
        "Exits 1 when a check fails.",
    )
    _clients(soak, requests=100_000, concurrency=32)
    soak.add_argument(
        "--every",
        type=positive(int),
        default=10_000,
        metavar="N",
        help="a sample and a progress line every N requests",
    )
    soak.add_argument("--seed", type=int, default=0)
    soak.add_argument(
        "--idle",
        type=float,
        default=20.0,
        metavar="S",
        help="after the last request, before the last sample",
    )
    soak.add_argument("--out", metavar="FILE.json", help="every sample and the tally")
    soak.set_defaults(handler=_soak)


def _add_coverage(commands: Subcommands) -> None:
    cov = commands.add_parser(
        "coverage",
        help="how often calibration's 95%% interval holds the true crossover",
        description="Calibrations of noisy emulated servers in virtual time (no servers, "
        "modelled seconds), each against the noise-free engine's crossover and beside a "
        "fixed grid of powers of two with 3 runs each: coverage, median width, backend time.",
    )
    cov.add_argument(
        "--hardware",
        default="kimi-k2.5-8x-pcie-fitted,llama3.1-8b-h200@2.0",
        help="hardware models, comma-separated, taken in turn; NAME@A: at accept length A",
    )
    cov.add_argument("--calibrations", type=positive(int), default=50)
    cov.add_argument("--noise", default="default", metavar="run=S,step=S")
    cov.add_argument("--input-len", type=positive(int), default=512)
    cov.add_argument("--output-len", type=positive(int), default=128)
    cov.add_argument("--max-running-requests", type=positive(int), default=256)
    cov.add_argument(
        "--grid-every",
        type=int,
        default=1,
        metavar="N",
        help="sweep the grid beside every N-th calibration (0: never)",
    )
    cov.add_argument("--seed", type=int, default=0)
    cov.add_argument("--out", metavar="FILE.json")
    cov.add_argument("--plot", metavar="FILE.png", help="needs matplotlib")
    cov.set_defaults(handler=_coverage)


def _sweep(args: argparse.Namespace) -> int:
    from specroute.loadgen.sweep import sweep

    run_loop(sweep(sweep_plan(args), args.concurrency, Path(args.out)))
    print(f"sweep written to {args.out}; next: specroute profile {args.out} -o profile.json")
    return 0


def _capacity(args: argparse.Namespace) -> int:
    from specroute.bench import capacity
    from specroute.bench.capacity import CapacityPlan, LevelResult

    plan = CapacityPlan(
        hardware=args.hardware,
        mode=args.mode,
        levels=tuple(args.levels),
        seconds=args.seconds_per_level,
        warmup=args.warmup,
        max_tokens=args.max_tokens,
        time_scale=args.time_scale,
    )
    load_hardware(plan.hardware)  # a bad name stops here, not in the emulator
    print(capacity.header(plan), flush=True)
    results: list[LevelResult] = []

    def done(result: LevelResult) -> None:
        results.append(result)
        print(capacity.progress_line(result), flush=True)

    try:
        run_loop(capacity.measure_capacity(plan, done))
    except KeyboardInterrupt:
        print("interrupted: the levels measured so far follow", file=sys.stderr)
    if not results:
        return 1
    print(capacity.render(results))
    _save(capacity.as_json(plan, results), args.out)
    return 0


def _modes(text: str) -> list[str]:
    found = [m.strip() for m in text.split(",") if m.strip()]
    if not found or not set(found) <= {"stream", "whole"}:
        raise argparse.ArgumentTypeError(f"modes are stream and whole, got {text!r}")
    return list(dict.fromkeys(found))


def _gateways(text: str) -> list[str]:
    from specroute.bench.overhead_targets import GATEWAYS

    found = [g.strip() for g in text.split(",") if g.strip()]
    if found == ["none"]:
        return []
    if not found or not set(found) <= set(GATEWAYS):
        raise argparse.ArgumentTypeError(
            f"gateways are {', '.join(GATEWAYS)} or none, got {text!r}"
        )
    return list(dict.fromkeys(found))


def _overhead(args: argparse.Namespace) -> int:
    from specroute.bench import overhead_report as report
    from specroute.bench.overhead import OverheadPlan, Window, measure_overhead

    quick = {"levels": (1, 16), "repeats": 1, "warmup": 0.4, "seconds": 1.0} if args.quick else {}
    plan = OverheadPlan(
        **{
            "levels": tuple(args.levels),
            "repeats": args.repeats,
            "workers": tuple(args.workers),
            "bare_workers": tuple(args.bare_workers),
            "online_off": args.online_off,
            "aiohttp_front": args.aiohttp_front,
            "one_backend": args.one_backend,
            "lean": args.lean,
            "baseline": args.baseline,
            "modes": tuple(args.modes),
            "warmup": args.warmup,
            "seconds": args.seconds,
            "chunks": args.chunks,
            "gap_ms": args.gap_ms,
            "gateways": tuple(args.gateways),
            "router_cores": args.router_cores,
            "profile_dir": args.profile_dir,
            "profile_levels": tuple(args.profile_levels),
            "profile_format": args.profile_format,
            "profile_seconds": args.profile_seconds,
            **quick,
        }
    )
    notes: list[str] = []
    windows: list[Window] = []

    def note(text: str) -> None:
        notes.append(text)
        _note(text)

    began = time.monotonic()
    try:
        ran = run_loop(measure_overhead(plan, note, windows.append))
    except KeyboardInterrupt:
        print("interrupted: the windows measured so far follow", file=sys.stderr)
        ran = {"targets": list(dict.fromkeys(w.target for w in windows))}
    if not windows:
        return 1
    notes.append(f"{len(windows)} windows in {time.monotonic() - began:.0f} s")
    rows = report.summarize(windows, ran["targets"])
    print(report.render(plan, rows, notes))
    command = report.command_line(plan, args.out, args.plot)
    document = report.as_json(plan, ran, windows, rows, notes, command)
    _save(document, args.out)
    if args.plot:
        from specroute.bench.overhead_plot import plot_overhead

        draw(lambda: plot_overhead(document, Path(args.plot)), args.plot)
    return 0


def _chaos(args: argparse.Namespace) -> int:
    from specroute.bench.chaos import ChaosPlan, render, run_chaos

    plan = ChaosPlan(
        requests=args.requests,
        concurrency=args.concurrency,
        seed=args.seed,
        spec_backends=args.spec_backends,
        base_backends=args.base_backends,
        events=args.events,
        time_scale=args.time_scale,
    )
    result = run_loop(run_chaos(plan, _note))
    return _verdict(render(result), result.as_json(), result.ok, args.out)


def _soak(args: argparse.Namespace) -> int:
    from specroute.bench.soak import SoakPlan, render, run_soak

    plan = SoakPlan(
        requests=args.requests,
        concurrency=args.concurrency,
        every=args.every,
        seed=args.seed,
        idle=args.idle,
    )
    result = run_loop(run_soak(plan, _note))
    return _verdict(render(result), result.as_json(), result.ok, args.out)


def _note(line: str) -> None:
    """A benchmark's progress, on stderr so that its report alone goes to stdout."""
    print(line, file=sys.stderr, flush=True)


def _verdict(report: str, document: dict[str, Any], ok: bool, out: str | None) -> int:
    """A benchmark that checks itself: its report, its JSON kept, 1 when a check failed."""
    print(report)
    _save(document, out)
    return 0 if ok else 1


def _save(document: dict[str, Any], out: str | None) -> None:
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        _write(document, Path(out))
        print(f"written to {out}")


def _write(document: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(document, indent=1) + "\n")


def _compare(args: argparse.Namespace) -> int:
    from specroute.bench.compare import ComparePlan, compare, policy_specs, render
    from specroute.loadgen.trace import named_trace

    rate = args.peak_rate if args.peak_rate is not None else float(args.peak)
    trace = named_trace(args.trace, args.peak, args.phase_seconds, rate)
    policies = tuple(spec.label for spec in policy_specs(args.policies))
    if args.offline:
        results = _offline(args, trace, policies)
    elif args.router_config is None:
        raise ValueError("compare needs --router-config FILE.toml (or --offline)")
    else:
        plan = ComparePlan(
            router_config=Path(args.router_config),
            trace=trace,
            dataset=dataset(args),
            policies=policies,
            slo=args.slo,
            ignore_eos=args.ignore_eos,
            settle=args.settle,
            seed=args.seed,
            output_len=args.output_len,
        )
        results = run_loop(compare(plan, Path(args.out)))
    print(render(results))
    if args.plot:
        from specroute.bench.compare_plot import plot_compare

        draw(lambda: plot_compare(results, Path(args.plot)), args.plot)
    if args.online_plot:
        if "online_live" not in results:
            print('no online plot: the replay learned nothing (offline, online = "adopt")')
        else:
            from specroute.bench.online_plot import plot_online

            draw(lambda: plot_online(results, Path(args.online_plot)), args.online_plot)
    return 0


def _offline(args: argparse.Namespace, trace: Trace, policies: tuple[str, ...]) -> dict[str, Any]:
    """The router's settings from its config, the backends from the model flags."""
    from specroute.bench.compare import PolicySpec
    from specroute.bench.replay import ReplayPlan, compare_offline
    from specroute.policies.policy import Policy
    from specroute.policies.profile import load_profile
    from specroute.policies.registry import build_policy
    from specroute.router.settings import RouterSettings

    given = {"config": args.router_config, "profile": args.profile}
    if args.router_config is None:  # no servers: names for them are all that is needed
        given |= {"spec": ["http://spec"], "base": ["http://base"]}
    settings = RouterSettings(**{k: v for k, v in given.items() if v is not None})
    profile = load_profile(settings.routing.profile) if settings.routing.profile else None
    plan = ReplayPlan(
        trace,
        dataset(args),
        servers={pool: emulator_config(args, pool) for pool in ("spec", "base")},
        backends={"spec": tuple(settings.backends.spec), "base": tuple(settings.backends.base)},
        source=settings.routing.concurrency_source,
        poll_interval=settings.health.poll_interval,
        slo=args.slo,
        ignore_eos=args.ignore_eos,
        settle=args.settle,
        seed=args.seed,
        output_len=args.output_len,
    )

    def build(spec: PolicySpec) -> Policy:
        """As its router process would be: its parameters over the config's, validated."""
        ours: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
        mine = RouterSettings(**ours | {"policy": spec.name, "given_params": dict(spec.params)})
        return build_policy(spec.name, mine.policy_params(), profile)

    built = {label: build(PolicySpec.parse(label)) for label in policies}
    results = compare_offline(plan, built, _note, _learning(settings, profile))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    _write(results, Path(args.out) / "compare.json")
    return results


def _learning(settings: RouterSettings, profile: Profile | None) -> Callable[[], Learning] | None:
    """With ``online = "adopt"`` in the router's config, the router's online estimator and
    its exploration as its settings make them, a fresh one for each policy replayed."""
    from specroute.bench.learning import Learning
    from specroute.online.estimator import Online, OnlineMode
    from specroute.router.components import exploration, sureness
    from specroute.router.components import samples as online_samples

    if settings.online.mode is not OnlineMode.ADOPT:
        return None
    per_level = settings.online.window_samples

    def fresh() -> Learning:
        samples = online_samples(settings.online)
        online = Online(
            OnlineMode.ADOPT,
            samples,
            sureness(settings.online),
            per_level=per_level,
            accept_tolerance=settings.online.accept_tolerance,
        )
        explores = exploration(settings.online, online)
        return Learning(online, profile, settings.online.interval, exploration=explores)

    return fresh


def _seconds(text: str) -> list[float]:
    values = [float(part) for part in text.split(",")]
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"must be positive seconds, got {text!r}")
    return values


def _replicas(args: argparse.Namespace) -> int:
    from specroute.bench.replicas import ReplicasPlan, measure_replicas, render

    plan = ReplicasPlan(
        replicas=tuple(args.replicas),
        polls=tuple(args.polls),
        seconds=args.seconds,
        time_scale=args.time_scale,
    )
    rows = run_loop(measure_replicas(plan, _note))
    print(render(rows))
    if args.out:
        _write({"plan": asdict(plan), "rows": [r.as_json() for r in rows]}, Path(args.out))
    return 0


def _affinity(args: argparse.Namespace) -> int:
    from specroute.bench.affinity import AffinityPlan, measure_affinity, render

    plan = AffinityPlan(
        system_prompts=args.system_prompts,
        cache_tokens=args.cache_tokens,
        requests=args.requests,
        rate=args.rate,
        time_scale=args.time_scale,
    )
    results = run_loop(measure_affinity(plan, _note))
    print(render(results))
    if args.out:
        _write({"plan": asdict(plan), "results": [r.as_json() for r in results]}, Path(args.out))
    return 0


def _add_convergence(commands: Subcommands) -> None:
    convergence = commands.add_parser(
        "convergence",
        help="online calibration from no profile, or one 4x high or low: how long --online "
        "adopt takes to route by the truth, and what exploring costs, in virtual time",
        description="A pair of the model on one GPU group, routed by the crossover with "
        "--online adopt and every other online setting at the router's defaults, started "
        "with no profile and with a crossover 4x above and below the truth (what calibrating "
        "the pair finds), on a ramp from a quarter of the truth to four times it and back, "
        "and on the Azure LLM inference trace 2023 at a mean load of 1.5 times the truth. "
        "A mixture-of-experts model's truth is bands: each of their edges is started off by "
        "the factor and must come between the levels around it. Each run says when the "
        "bands routed by came to agree with the truth's for good, the requests by then, and "
        "the tok/s exploring cost.",
    )
    add_model_flags(convergence)
    convergence.add_argument(
        "--starts",
        default="none,4x high,4x low",
        help="of: none, 4x high, 4x low ('' with --fixed: the fixed crossovers alone)",
    )
    convergence.add_argument(
        "--traffic", default="ramp,azure", help="of: ramp, azure (comma-separated)"
    )
    convergence.add_argument(
        "--ramps", type=int, default=4, help="the ramp's cycles (8 minutes each)"
    )
    convergence.add_argument(
        "--window", default="0+3600", metavar="START+SECONDS", help="of the Azure trace"
    )
    convergence.add_argument(
        "--prompts",
        default="",
        metavar="N1,N2,...",
        help="prompt lengths in tokens, two or more: a context bucket each, routed by "
        "context-crossover from a v2 profile whose buckets start off by the factor (each "
        "ramp step's minute split among them; the ramp only, and a start off by a factor)",
    )
    convergence.add_argument(
        "--live",
        type=float,
        metavar="TIME_SCALE",
        help="run each start on each traffic live too: the pair as emulator processes at "
        "this time scale, a router in front, every time setting of the router scaled by it; "
        "a run whose servers lag their time says so and the command exits 1",
    )
    convergence.add_argument(
        "--fixed",
        default="",
        metavar="C1,C2,...",
        help="also route by each of these crossovers throughout, on each traffic, with no "
        "online calibration (0: never speculate): which the traffic rewards",
    )
    convergence.add_argument(
        "--online-at-prefill",
        action=argparse.BooleanOptionalAction,
        help="the router's online_at_prefill (on by default, as the router's): each sample "
        "read at its level's prefill; --no-online-at-prefill reads each as measured",
    )
    convergence.add_argument(
        "--draws",
        type=positive(int),
        default=1,
        metavar="N",
        help="replay each start on each traffic N times, the prompts' words drawn from seeds "
        "--seed to --seed + N - 1 (the emulator's model stays --seed's; offline only): how "
        "often each start came in for good and held there",
    )
    convergence.add_argument("--out", metavar="FILE.json")
    convergence.set_defaults(handler=_convergence)


def _convergence(args: argparse.Namespace) -> int:
    from specroute.bench.convergence import (
        STARTS,
        azure_at,
        converge,
        document,
        drawn,
        fixed,
        render,
    )
    from specroute.loadgen.request_trace import azure_conversations

    model = tuple(given_model_flags(args))
    starts = [s.strip() for s in args.starts.split(",") if s.strip()]
    traffics = [t.strip() for t in args.traffic.split(",")]
    unknown = [s for s in starts if s not in STARTS] + [
        t for t in traffics if t not in ("ramp", "azure")
    ]
    if unknown:
        raise ValueError(f"not a start or a traffic: {', '.join(unknown)}")
    prompts = tuple(int(n) for n in args.prompts.split(",") if n.strip())
    if prompts and (len(prompts) < 2 or "none" in starts or traffics != ["ramp"]):
        raise ValueError(
            "--prompts takes two or more lengths, on --traffic ramp, from starts off by a "
            "factor (without a profile there are no context buckets)"
        )
    if args.live is not None and prompts:
        raise ValueError("--live runs one context: leave --prompts out")
    routed = [float(c) for c in args.fixed.split(",") if c.strip()]
    if any(c < 0 for c in routed) or not (starts or routed):
        raise ValueError("--fixed takes crossovers of 0 or more; give it or --starts")
    runs, live, held, draws = [], [], [], []
    for traffic in traffics:
        given: RequestTrace | int = args.ramps
        if traffic == "azure":
            start, _, seconds = args.window.partition("+")
            window = azure_conversations().window(float(start), float(seconds))
            given = azure_at(window, model)
        at_prefill = args.online_at_prefill
        runs += [
            converge(model, s, given, args.seed, _note, prompts=prompts, at_prefill=at_prefill)
            for s in starts
        ]
        for run in runs[-len(starts) :] if args.draws > 1 else []:
            draws.append(drawn(run, args.seed))
            for seed in range(args.seed + 1, args.seed + args.draws):
                _note(f"{run.start}, {traffic}: draw {seed - args.seed + 1} of {args.draws}")
                again = converge(model, run.start, given, seed, _note, False, prompts, at_prefill)
                draws.append(drawn(again, seed))
        if args.live is not None:
            live += run_loop(_converge_live(model, starts, given, args.live, at_prefill))
        if routed:
            _note(f"{traffic}: fixed crossovers {', '.join(f'{c:g}' for c in routed)}")
            held += fixed(model, given, routed)
    found = document(model, runs, live, held, args.online_at_prefill, draws)
    print(render(found))
    _save(found, args.out)
    late = [kept.said() for _, kept in live if not kept.kept]
    for said in late:
        print(f"NOT KEPT TIME: {said}", file=sys.stderr)
    return 1 if late else 0


async def _converge_live(
    model: tuple[str, ...],
    starts: list[str],
    traffic: RequestTrace | int,
    time_scale: float,
    at_prefill: bool | None = None,
) -> list[tuple[Converged, Kept]]:
    """Each start on ``traffic`` live, one after the other, each in a folder of its own."""
    from specroute.bench.convergence_live import converge_live

    found = []
    for start in starts:
        _note(f"from {start}, live at time scale {time_scale:g}")
        with tempfile.TemporaryDirectory() as folder:
            found.append(
                await converge_live(model, start, traffic, time_scale, Path(folder), at_prefill)
            )
    return found


def _deployments(args: argparse.Namespace) -> int:
    from specroute.bench.deployments import Live, head_to_head, kept_time, render
    from specroute.loadgen.request_trace import azure_conversations, shaped

    start, _, seconds = args.window.partition("+")
    try:
        window = azure_conversations().window(float(start), float(seconds))
    except ValueError as exc:
        raise ValueError(f"--window {args.window}: {exc}") from None
    unknown = set(args.live) - set(args.utilisation)
    if unknown:
        raise ValueError(f"--live {sorted(unknown)}: not among --utilisation {args.utilisation}")
    traffic = window if args.traffic == "azure" else shaped(args.traffic, window, args.seed)
    document = head_to_head(
        given_model_flags(args),
        traffic,
        args.utilisation,
        args.slo,
        _note,
        args.topology,
        Live(tuple(args.live), args.time_scale) if args.live else None,
    )
    print(render(document))
    _save(document, args.out)
    if args.plot:
        from specroute.bench.deployments_plot import plot_deployments

        plot_deployments(document, Path(args.plot))
    return 1 if kept_time(document) is False else 0


def _coverage(args: argparse.Namespace) -> int:
    from specroute.bench.coverage import CoveragePlan, coverage, render
    from specroute.bench.coverage_plot import plot_coverage
    from specroute.emulator.noise import parse_noise
    from specroute.loadgen.dataset import synthetic

    def config(given: str) -> Any:
        name, _, accept = given.strip().partition("@")
        return emulator_config(
            argparse.Namespace(
                hardware=name,
                accept_rate=None,
                accept_length=float(accept) if accept else None,
                speculative_num_steps=None,
                time_scale=1.0,
                cuda_graph_max_bs=None,
                max_running_requests=args.max_running_requests,
                seed=args.seed,
                noise=parse_noise(args.noise),
            )
        )

    configs = tuple(config(name) for name in args.hardware.split(","))
    plan = CoveragePlan(
        configs,
        synthetic(args.input_len, args.output_len),
        calibrations=args.calibrations,
        input_len=args.input_len,
        output_len=args.output_len,
        grid_every=args.grid_every,
        seed=args.seed,
    )
    result = coverage(plan)
    print(render(result))
    if args.out:
        _write(result, Path(args.out))
    if args.plot:
        draw(lambda: plot_coverage(result, Path(args.plot)), args.plot)
    return 0
