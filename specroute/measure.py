"""The measuring commands, each with its handler: ``profile`` and ``calibrate``. Heavy
modules (numpy, the analysis) load only in the handler that needs them, so ``specroute
serve`` starts without them."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from specroute.event_loop import run as run_loop
from specroute.flags import add_report_flags, add_workload_flags, slo, sweep_plan

if TYPE_CHECKING:
    from specroute.emulator.config import EmulatorConfig
    from specroute.flags import Subcommands
    from specroute.profiler.calibration import Calibration
    from specroute.profiler.context_calibration import Bucket


def add_profile(sub: Subcommands) -> None:
    profile = sub.add_parser(
        "profile",
        help="turn a sweep folder, or a router's live fit, into a specroute.profile file",
        description="Medians, bootstrap intervals and the crossover of a sweep. A "
        "calibration's folder of context buckets (input-len-N) gives a specroute.profile/v2. "
        "With --from-live, the profile of a serving router's online calibration instead: "
        "its live crossover and curves (GET /router/profile/live, with its admin key).",
    )
    source = profile.add_mutually_exclusive_group(required=True)
    source.add_argument("sweep", metavar="DIR", nargs="?", help="a sweep or calibration folder")
    source.add_argument(
        "--from-live",
        metavar="URL",
        help="a serving router (http://HOST:PORT): the profile of its live fit",
    )
    add_report_flags(profile)
    profile.add_argument("--slo", type=slo, default=None, metavar="ttft=S,tpot=S")
    profile.add_argument("--seed", type=int, default=0)
    live = profile.add_argument_group("from a serving router (--from-live)")
    live.add_argument(
        "--admin-key-file",
        metavar="FILE",
        help="the router's admin key, read from FILE (default: the SPECROUTE_ADMIN_KEY "
        "environment variable); never on the command line",
    )
    live.add_argument(
        "--compare",
        metavar="calibrated.json",
        help="a calibrated profile: its crossover, interval and per-level TPOT beside the "
        "live one's, printed and added to --report",
    )
    profile.set_defaults(handler=_profile)


def add_adaptive_config(sub: Subcommands) -> None:
    adaptive = sub.add_parser(
        "adaptive-config",
        help="write a profile as SGLang's --speculative-adaptive-config schedule",
        description="The speculative server's own adaptive schedule (SGLang 0.5.23's "
        "--speculative-adaptive) from a profile: the calibrated depth at the batch sizes "
        "where speculation pays, depth 0 elsewhere, each slot at a captured CUDA-graph batch "
        "size. Printed, or written to --output.",
    )
    adaptive.add_argument("profile", metavar="PROFILE", help="a specroute.profile file")
    adaptive.add_argument("-o", "--output", metavar="FILE", help="default: standard output")
    adaptive.add_argument(
        "--steps",
        type=int,
        metavar="S",
        help="the depth where speculation pays (default: the speculative server's "
        "speculative_num_steps, as the profile records it)",
    )
    adaptive.add_argument(
        "--cuda-graph-max-bs",
        type=int,
        metavar="N",
        help="SGLang: the server's largest captured batch (default: as the profile records it)",
    )
    adaptive.add_argument(
        "--engine",
        choices=("sglang", "vllm"),
        default="sglang",
        help="sglang (default): its --speculative-adaptive-config file; vllm: the list of "
        "[first, last, tokens] batch-size ranges its --speculative-config takes as "
        "num_speculative_tokens_per_batch_size",
    )
    adaptive.set_defaults(handler=_adaptive_config)


def _adaptive_config(args: argparse.Namespace) -> int:
    import json
    import sys

    from specroute.policies.profile import load_profile
    from specroute.profiler.adaptive_schedule import (
        adaptive_schedule,
        depth_of,
        describe,
        resolved,
        started_with,
        vllm_schedule,
        vllm_started_with,
    )

    profile = load_profile(args.profile)
    if args.engine == "vllm":
        steps = depth_of(profile, args.steps)
        ranges = vllm_schedule(profile, steps)
        text, said = json.dumps(ranges) + "\n", vllm_started_with(ranges, steps)
    else:
        steps, graphs = resolved(profile, args.steps, args.cuda_graph_max_bs)
        schedule = adaptive_schedule(profile, steps, graphs)
        text = json.dumps(schedule, indent=2) + "\n"
        said = f"{describe(schedule, graphs)}\n{started_with(args.output or 'FILE', steps)}"
    if args.output is None:
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
    print(said, file=sys.stderr)
    return 0


def add_calibrate(sub: Subcommands) -> None:
    calibrate = sub.add_parser(
        "calibrate",
        help="sweep and profile in one go, refining around the crossover",
        description="Doubles the concurrency from 1 (one run per level) while speculation pays, "
        "measures the levels around the crossing again until each has --repeats runs (at "
        "least 3), then levels inside the bracket, until the crossover's interval is narrow "
        "enough or the budget is spent. Several --input-len: the crossover per context, "
        "shortest first, within the one budget (a specroute.profile/v2).",
    )
    add_workload_flags(calibrate, contexts=True)
    add_report_flags(calibrate)
    calibrate.add_argument(
        "--budget",
        type=float,
        default=15,
        metavar="MINUTES",
        help="backend time to spend, at most (default: %(default)s)",
    )
    calibrate.add_argument(
        "--max-concurrency",
        type=int,
        default=None,
        metavar="N",
        help="a hard ceiling: never measure above N. Default: none; the search doubles "
        "until speculation stops paying, the budget ends, or the servers' max running "
        "requests (when both report it)",
    )
    calibrate.add_argument(
        "--precision",
        type=float,
        default=0.3,
        help="stop when the interval is this fraction of the value",
    )
    calibrate.add_argument("--out", metavar="DIR", help="the sweep folder (default: beside -o)")
    calibrate.set_defaults(handler=_calibrate)


def draw(plot: Callable[[], None], path: str | Path) -> None:
    """Plots need matplotlib, an optional extra: without it, say so and go on."""
    try:
        plot()
        print(f"plot written to {path}")
    except ImportError:
        print("no plot: matplotlib is not installed (pip install 'specroute[plot]')")


def _write(document: dict[str, Any], args: argparse.Namespace, output: str | None = None) -> None:
    from specroute.policies.profile import save_profile
    from specroute.profiler.report import render_report

    output = output or args.output
    save_profile(document, output)
    print(f"profile written to {output}")
    if args.report:
        Path(args.report).write_text(render_report(document))
        print(f"report written to {args.report}")
    if args.plot:
        from specroute.profiler.plot import plot_profile

        draw(lambda: plot_profile(document, Path(args.plot)), args.plot)
    from specroute.profiler.report import banded, context_lines, interval_text

    for key, label in (("crossover", "per-request TPOT"), ("throughput_crossover", "throughput")):
        c = document[key]
        if banded(c):
            spans = "; ".join(
                f"{'1' if a is None else f'{a:.1f}'} to {b:.1f}" for a, b in c["bands"]
            )
            print(f"{label}: speculation pays in {len(c['bands'])} band(s) of load: {spans}")
        elif c["value"] is None:
            where = "every" if c["bound"] == "above" else "no"
            print(f"{label}: speculation pays at {where} level measured (limit {c['limit']:g})")
        else:
            print(f"{label}: crossover {c['value']:.1f} (95% {interval_text(c['ci'])})")
    if "context" in document:
        print("by context:", *context_lines(document), sep="\n")


def _profile(args: argparse.Namespace) -> int:
    """One sweep folder: a v1 profile. A calibration's folder of context buckets (its
    ``input-len-N`` folders): v2, a bucket per folder, as the calibration wrote it but for
    the search's own record. ``--from-live``: a router's live fit."""
    if args.from_live is not None:
        return _from_live(args)
    for flag, given in (("--admin-key-file", args.admin_key_file), ("--compare", args.compare)):
        if given is not None:
            raise ValueError(f"{flag} goes with --from-live")
    from specroute.profiler.analysis import analyse, profile_document
    from specroute.profiler.sweep_data import load_sweep

    path = Path(args.sweep)
    analyses = []
    for folder in _bucket_folders(path) or [path]:
        data = load_sweep(folder)
        slo_ = args.slo if args.slo is not None else data.meta.get("settings", {}).get("slo")
        analyses.append(analyse(data, slo_, args.seed))
    _write(profile_document(analyses[0], analyses), args)
    return 0


def _from_live(args: argparse.Namespace) -> int:
    """The router's live profile, checked as any profile is (``save_profile``) and written;
    its report, and a calibrated profile beside it, if asked for."""
    from specroute.policies.profile import load_profile, save_profile
    from specroute.profiler.live_report import comparison_lines, render_live_report
    from specroute.profiler.live_source import admin_key, fetch_live
    from specroute.profiler.report import context_lines, crossover_text

    for flag, given in (("--plot", args.plot), ("--slo", args.slo)):
        if given is not None:
            raise ValueError(f"{flag} is for a sweep's profile: a live fit has TPOT alone")
    key = admin_key(args.admin_key_file, os.environ)
    calibrated = None
    if args.compare is not None:
        calibrated = load_profile(args.compare).raw  # a bad file stops here, before the fetch
    document = run_loop(fetch_live(args.from_live, key))
    save_profile(document, args.output)
    print(f"live profile written to {args.output}")
    meta = document["measurement"]
    sure = "sure" if all(meta["sureness"]["sure"]) else "not yet sure"
    print(
        f"per-request TPOT: crossover {crossover_text(document['crossover'])}, from "
        f"{meta['samples_counted']} live samples ({sure} by the router's rule)"
    )
    if "context" in document:
        print("by context:", *context_lines(document), sep="\n")
    if args.report:
        Path(args.report).write_text(render_live_report(document, calibrated))
        print(f"report written to {args.report}")
    if calibrated is not None:
        print(*comparison_lines(document, calibrated), sep="\n")
    return 0


def _bucket_folders(path: Path) -> list[Path]:
    """A calibration's context buckets, shortest prompts first; none in a plain sweep."""
    if (path / "meta.json").exists():
        return []
    found = [
        (int(f.name.removeprefix(_BUCKET)), f)
        for f in path.glob(f"{_BUCKET}*")
        if f.name.removeprefix(_BUCKET).isdigit()
    ]
    return [f for _, f in sorted(found)]


def _calibrate(args: argparse.Namespace) -> int:
    from specroute.profiler.calibration import CalibrationPlan
    from specroute.profiler.context_calibration import Bucket

    lengths = args.input_len
    if len(lengths) > 1 and args.dataset[0] != "synthetic":
        raise ValueError(
            "several --input-len need --dataset synthetic: other prompts have their own lengths"
        )
    out = Path(args.out) if args.out else Path(args.output).with_suffix(".sweep")
    buckets = [
        Bucket(
            CalibrationPlan(
                sweep_plan(args, n), max_concurrency=args.max_concurrency, precision=args.precision
            ),
            out if len(lengths) == 1 else out / _folder(n),
        )
        for n in lengths
    ]
    _report_calibration(buckets, args)
    return 0


_BUCKET = "input-len-"


def _folder(input_len: int) -> str:
    """A context bucket's sweep folder, inside the calibration's."""
    return f"{_BUCKET}{input_len}"


def rehearse(config: EmulatorConfig, args: argparse.Namespace) -> int:
    """``emulate --calibrate``: the calibration search on this model's engine in virtual
    time, its sweep in ``--out`` or a temporary folder (a folder per context bucket with
    several ``--input-len``), its profile, report and plot written."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(args.out) if args.out else Path(folder) / "calibration"
        buckets = rehearsal_buckets(config, args.input_len, args.output_len, args.seed, out)
        _report_calibration(buckets, args, args.profile, kept=bool(args.out))
    return 0


def rehearsal_buckets(
    config: EmulatorConfig, lengths: list[int], output_len: int, seed: int, out: Path
) -> list[Bucket]:
    """A virtual sweep per prompt length, each drawing noise of its own: the k-th bucket's
    runs are seeded by ``seed + k`` (the first, alone, as a calibration of one length)."""
    from specroute.loadgen.dataset import synthetic
    from specroute.loadgen.sweep import SweepPlan
    from specroute.loadgen.virtual_sweep import VirtualSweep
    from specroute.profiler.calibration import CalibrationPlan
    from specroute.profiler.context_calibration import Bucket

    buckets = []
    for k, n in enumerate(lengths):
        plan = SweepPlan("virtual", "virtual", synthetic(n, output_len))
        where = out if len(lengths) == 1 else out / _folder(n)
        sweep = VirtualSweep(plan, where, config, input_len=n, output_len=output_len, seed=seed + k)
        buckets.append(Bucket(CalibrationPlan(plan), where, sweep))
    return buckets


def _report_calibration(
    buckets: list[Bucket],
    args: argparse.Namespace,
    output: str | None = None,
    kept: bool = True,
) -> None:
    """Calibrate each context bucket within the one ``--budget`` and write the profile: v1
    for one bucket, as always; v2 for several, each bucket's calibration beside its
    crossover and the first's also where v1 has it. A sweep not ``kept`` is named nowhere."""
    from specroute.profiler.analysis import profile_document
    from specroute.profiler.context_calibration import calibrate_contexts

    results = run_loop(calibrate_contexts(buckets, args.budget * 60))
    document = profile_document(results[0].analysis, [r.analysis for r in results])
    document["measurement"]["calibration"] = results[0].as_json()
    axis = document.get("context", {}).get("buckets") or [{}]  # v1: the one bucket, unnamed
    if len(axis) > 1:
        for bucket, result in zip(axis, results, strict=True):
            bucket["calibration"] = result.as_json()
    if not kept:
        for named in (document["measurement"], *(b for b in axis if "sweep" in b)):
            named["sweep"] = None
    _write(document, args, output)
    for bucket, result in zip(axis, results, strict=True):
        where = f"context {bucket['context']:g}: " if "context" in bucket else ""
        print(where + _cost_line(result))


def _cost_line(result: Calibration) -> str:
    runs = ", ".join(f"{lvl} x{result.runs[lvl]}" for lvl in sorted(result.runs))
    grid = (
        "no crossing was measured, so there is no uniform grid to compare with"
        if result.grid_levels is None or result.grid_seconds is None
        else f"a uniform grid as fine around the crossover would take {result.grid_levels}"
        f" levels, about {result.grid_seconds:.0f} s"
    )
    return (
        f"calibration: {len(result.levels)} levels (runs per backend: {runs}), "
        f"{result.backend_seconds:.0f} s of backend time; {grid}. Stopped: {result.stopped}."
    )
