"""The ``specroute`` command line: builds the parser, and each sub-command names its handler."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from specroute import bench_commands, logs, measure, serve_command
from specroute.emulator.hardware import load_hardware
from specroute.flags import lengths, levels
from specroute.model_flags import add_model_flags, emulator_config, positive
from specroute.release import release

if TYPE_CHECKING:
    from specroute.emulator.config import EmulatorConfig
    from specroute.flags import Subcommands

Handler = Callable[[argparse.Namespace], int]

_ABOUT = """\
Serve an LLM with speculative decoding (EAGLE-3) while it pays, and without it when the GPUs
are busy: an OpenAI-compatible router in front of a speculative and a plain SGLang server,
the calibration that measures where speculation stops paying on your deployment, and an
emulated SGLang server to rehearse all of it without a GPU."""

_EXAMPLES = """\
typical use:
  specroute calibrate --spec URL --base URL -o profile.json   measure the crossover
  specroute serve --spec URL --base URL --profile profile.json  route by it (port 8000)
  specroute demo                                               the whole loop, emulated

'specroute COMMAND --help' tells more of each command."""


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="specroute",
        description=_ABOUT,
        epilog=_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    root.add_argument("--version", action="version", version=f"specroute {release()}")
    sub = root.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (
        serve_command.add_serve,
        measure.add_calibrate,
        measure.add_profile,
        measure.add_adaptive_config,
        bench_commands.add_bench,
        _add_emulate,
        _add_demo,
    ):
        add(sub)
    return root


def _add_emulate(sub: Subcommands) -> None:
    emulate = sub.add_parser(
        "emulate",
        help="serve an emulated SGLang server, or print its predicted speeds",
        description="An SGLang-faithful server whose timing comes from a hardware model.",
    )
    emulate.add_argument("--mode", choices=["spec", "base"], help="EAGLE-3 or plain decoding")
    emulate.add_argument("--host", default="127.0.0.1")
    emulate.add_argument("--port", type=int, default=30000)
    emulate.add_argument(
        "--time-scale",
        type=positive(float),
        default=1.0,
        metavar="F",
        help="multiply every modelled duration by F (0.25 runs 4x faster)",
    )
    emulate.add_argument("--max-queued-requests", type=positive(int), metavar="N")
    emulate.add_argument("--context-length", type=positive(int), default=131072)
    emulate.add_argument("--decode-log-interval", type=positive(int), default=40)
    emulate.add_argument("--api-key", metavar="KEY", help="require this bearer key, as SGLang")
    emulate.add_argument(
        "--stream-interval",
        type=positive(int),
        default=1,
        metavar="N",
        help="stream a request's tokens N at a time, as SGLang's flag",
    )
    emulate.add_argument(
        "--fault",
        action="append",
        metavar="KIND[:VALUE][,KEY=VALUE...]",
        help="inject a fault into the generation endpoints (repeatable, or several joined by "
        "';'): refuse, status:CODE, stall_first:S, stall_mid:K, cut_mid:K, crash[:K], slow:F, "
        "compress; keys seconds, after, mid_event, probability, count. "
        "GET/POST/DELETE /emulator/faults changes them while serving",
    )
    add_model_flags(emulate)
    emulate.add_argument(
        "--predict",
        type=levels,
        metavar="C1,C2,...",
        help="print steady-state speeds of both modes at these concurrencies",
    )
    emulate.add_argument(
        "--input-len",
        type=lengths,
        default=[512],
        metavar="N[,N...]",
        help="prompt tokens per request; several: the crossover per context (with --predict "
        "or --calibrate; the profile is then specroute.profile/v2)",
    )
    emulate.add_argument("--output-len", type=positive(int), default=256)
    emulate.add_argument("--json", action="store_true", help="with --predict: print JSON")
    emulate.add_argument(
        "--calibrate",
        action="store_true",
        help="rehearse `specroute calibrate` on this model in virtual time (no servers; "
        "backend time is modelled seconds; add --noise to make runs differ as a real engine's "
        "do) and write its profile to --profile",
    )
    emulate.add_argument(
        "--profile",
        metavar="FILE",
        help="with --predict: also write it as a profile (marked predicted), to rehearse "
        "routing; with --calibrate: the calibration's profile",
    )
    emulate.add_argument("--report", metavar="report.md", help="with --calibrate: in words")
    emulate.add_argument("--plot", metavar="bands.png", help="with --calibrate: needs matplotlib")
    emulate.add_argument(
        "--budget",
        type=float,
        default=math.inf,
        metavar="MINUTES",
        help="with --calibrate: modelled backend time to spend, at most (default: no limit)",
    )
    emulate.add_argument(
        "--out", metavar="DIR", help="with --calibrate: keep the sweep here (default: not kept)"
    )
    emulate.set_defaults(handler=_emulate)


def _add_demo(sub: Subcommands) -> None:
    demo = sub.add_parser(
        "demo",
        help="the whole loop on emulated servers: calibrate, route, compare",
        description="Two emulated SGLang servers, a quick calibration, the router with its "
        "profile, and a load ramp through it against both static choices (about 2 minutes).",
    )
    demo.add_argument(
        "--hardware",
        default="kimi-k2.5-8x-pcie-fitted",
        help="a shipped hardware model or a JSON file (default: %(default)s)",
    )
    demo.add_argument("--accept-length", type=positive(float), metavar="TAU")
    demo.add_argument("--time-scale", type=positive(float), default=0.1, metavar="F")
    demo.add_argument("--peak", type=positive(int), default=16, help="the ramp's top")
    demo.add_argument("--phase-seconds", type=positive(float), default=3.0)
    demo.add_argument("--out", default="specroute-demo", metavar="DIR")
    demo.set_defaults(handler=_demo)


def _emulate(args: argparse.Namespace) -> int:
    config = emulator_config(args)
    if (args.predict or args.calibrate) and config.share_gpus is not None:
        raise ValueError(
            "--share-gpus is for servers and replays; a prediction or a "
            "rehearsed calibration measures each server alone"
        )
    if args.out and not args.calibrate:
        raise ValueError("--out keeps a rehearsed calibration's sweep: it needs --calibrate")
    if args.predict:
        return _predict(config, args)
    if args.calibrate:
        if not args.profile:
            raise ValueError("--calibrate writes a profile: give --profile FILE")
        from specroute.measure import rehearse

        return rehearse(config, args)
    if args.mode is None:
        raise ValueError("--mode spec|base is required to serve (or pass --predict, --calibrate)")
    from specroute.emulator.server import serve

    serve(config)
    return 0


def _predict(config: EmulatorConfig, args: argparse.Namespace) -> int:
    """``emulate --predict``: one prediction per ``--input-len``; several make a context axis."""
    from specroute.emulator import predict as model

    found = [model.predict(config, args.predict, n, args.output_len) for n in args.input_len]
    title = f"{config.hardware.name}: predicted steady state"
    if args.json:
        each = [model.as_json(p) | {"context": p.context} for p in found]
        print(json.dumps(each if len(found) > 1 else model.as_json(found[0]), indent=1))
    elif len(found) > 1:
        print(model.render_contexts(found, title))
    else:
        print(model.render(found[0], title))
    if args.profile:
        if len(found) > 1:
            from specroute.loadgen.dataset import synthetic_tokens_per_byte

            ratio = synthetic_tokens_per_byte(args.input_len, args.output_len)
            document = model.as_context_profile(found, config, ratio)
        else:
            document = model.as_profile(found[0], config)
        Path(args.profile).write_text(json.dumps(document, indent=1))
        print(f"predicted profile written to {args.profile}", file=sys.stderr)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from specroute.demo import DemoPlan, demo

    load_hardware(args.hardware)  # a bad name stops here, not in two servers
    extra = ("--accept-length", f"{args.accept_length:g}") if args.accept_length else ()
    plan = DemoPlan(
        hardware=args.hardware,
        time_scale=args.time_scale,
        peak=args.peak,
        phase_seconds=args.phase_seconds,
        out=Path(args.out),
        server_flags=extra,
    )
    demo(plan)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    logs.configure()
    args = parser().parse_args(argv)
    handler: Handler = args.handler
    try:
        return handler(args)
    except (ValueError, RuntimeError) as exc:  # bad input, or a process that would not start
        print(f"specroute {args.command}: {exc}", file=sys.stderr)
        return 2
