"""The ``specroute`` command: parses arguments and hands over; no logic lives here."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from emulator.acceptance import Acceptance, AcceptanceError, accept_rate, parse_rules
from emulator.config import EmulatorConfig
from emulator.hardware import HardwareError, load_hardware
from specroute import measure


def _positive(kind: type[int] | type[float]) -> argparse._ActionType:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse


def _add_model_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--hardware",
        default="kimi-k2.5-8x-pcie",
        help="a shipped hardware model's name or a JSON file (default: %(default)s)",
    )
    acc = p.add_mutually_exclusive_group()
    acc.add_argument(
        "--accept-length",
        type=float,
        metavar="TAU",
        help="mean tokens per verify step, bonus included (default: the model's)",
    )
    acc.add_argument(
        "--accept-rate",
        type=float,
        metavar="ALPHA",
        help="probability that each draft is accepted given the ones before",
    )
    p.add_argument("--speculative-num-steps", type=_positive(int), metavar="S")
    p.add_argument(
        "--max-running-requests",
        type=_positive(int),
        metavar="N",
        help="default: 48 with speculation (as SGLang), the model's without",
    )
    p.add_argument("--cuda-graph-max-bs", type=_positive(int), metavar="N")
    p.add_argument("--seed", type=int, default=0)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specroute", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
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
        type=_positive(float),
        default=1.0,
        metavar="F",
        help="multiply every modelled duration by F (0.25 runs 4x faster)",
    )
    emulate.add_argument("--max-queued-requests", type=_positive(int), metavar="N")
    emulate.add_argument("--context-length", type=_positive(int), default=131072)
    emulate.add_argument("--decode-log-interval", type=_positive(int), default=40)
    emulate.add_argument("--api-key", metavar="KEY", help="require this bearer key, as SGLang")
    emulate.add_argument(
        "--stream-interval", type=_positive(int), default=1, metavar="N",
        help="stream a request's tokens N at a time, as SGLang's flag",
    )  # fmt: skip
    _add_model_flags(emulate)
    emulate.add_argument(
        "--predict",
        type=measure.levels,
        metavar="C1,C2,...",
        help="print steady-state speeds of both modes at these concurrencies",
    )
    emulate.add_argument("--input-len", type=_positive(int), default=512)
    emulate.add_argument("--output-len", type=_positive(int), default=256)
    emulate.add_argument("--json", action="store_true", help="with --predict: print JSON")
    demo = sub.add_parser(
        "demo", help="the whole loop on emulated servers: calibrate, route, compare",
        description="Two emulated SGLang servers, a quick calibration, the router with its "
        "profile, and a load ramp through it against both static choices (about 2 minutes).",
    )  # fmt: skip
    demo.add_argument(
        "--hardware", default="kimi-k2.5-8x-pcie",
        help="a shipped hardware model or a JSON file (default: %(default)s)",
    )  # fmt: skip
    demo.add_argument("--accept-length", type=_positive(float), metavar="TAU")
    demo.add_argument("--time-scale", type=_positive(float), default=0.1, metavar="F")
    demo.add_argument("--peak", type=_positive(int), default=16, help="the ramp's top")
    demo.add_argument("--phase-seconds", type=_positive(float), default=3.0)
    demo.add_argument("--out", default="specroute-demo", metavar="DIR")
    serve = sub.add_parser(
        "serve", help="run the router in front of speculative and plain backends",
        description="An OpenAI-compatible proxy that routes by live concurrency.",
    )  # fmt: skip
    serve.add_argument("--spec", action="append", metavar="URL", help="a speculative backend")
    serve.add_argument("--base", action="append", metavar="URL", help="a plain backend")
    serve.add_argument(
        "--policy",
        help="crossover (default), acceptance-crossover, expected-latency, always-spec, "
        "always-base, round-robin",
    )
    serve.add_argument("--crossover", type=float, metavar="N")
    serve.add_argument("--topology", choices=["shared", "partitioned"])
    serve.add_argument("--hysteresis", type=float)
    serve.add_argument("--profile", metavar="FILE", help="a specroute.profile/v1 file")
    serve.add_argument("--concurrency-source", choices=["router", "backend", "max"])
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--config", metavar="FILE", help="a TOML file of settings")
    keys = "prefer the environment (SPECROUTE_API_KEYS='[\"k\"]', SPECROUTE_ADMIN_KEY) over flags"
    serve.add_argument(
        "--api-key", dest="api_keys", action="append", metavar="KEY",
        help=f"a client key (repeatable); {keys}",
    )  # fmt: skip
    serve.add_argument("--admin-key", metavar="KEY", help="the key for POST /router/profile")
    serve.add_argument("--backend-api-key", metavar="KEY", help="sent to the backends")
    serve.add_argument("--drain-timeout", type=float, metavar="S")
    measure.add_commands(sub)
    return parser


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from policies.decision import PolicyError
    from policies.profile import ProfileError
    from router.serve import run
    from router.settings import RouterSettings

    flags = {k: v for k, v in vars(args).items() if k != "command" and v is not None}
    try:
        settings = RouterSettings(**flags)
    except ValidationError as exc:
        for error in exc.errors():
            key = ".".join(str(p) for p in error["loc"])
            value = "***" if "key" in key else error.get("input")
            print(f"specroute serve: bad setting {key}={value!r}: {error['msg']}", file=sys.stderr)
        return 2
    try:
        run(settings)
    except (PolicyError, ProfileError) as exc:
        print(f"specroute serve: {exc}", file=sys.stderr)
        return 2
    return 0


def _config(args: argparse.Namespace) -> EmulatorConfig:
    """The emulator settings from ``emulate`` or ``demo`` flags."""
    hardware = load_hardware(args.hardware)
    steps = args.speculative_num_steps or hardware.speculative_num_steps
    if args.accept_rate is not None:
        if not 0.0 <= args.accept_rate <= 1.0:
            raise AcceptanceError(f"--accept-rate {args.accept_rate} is outside [0, 1]")
        rate = args.accept_rate
    else:
        length = args.accept_length if args.accept_length is not None else hardware.accept_length
        rate = (
            accept_rate(min(length, steps + 1), steps)
            if args.accept_length is None
            else (accept_rate(length, steps))
        )
    acceptance = Acceptance(steps, rate, parse_rules(list(hardware.acceptance_rules), steps))
    return EmulatorConfig(
        mode=getattr(args, "mode", None) or "base",
        hardware=hardware,
        acceptance=acceptance,
        host=getattr(args, "host", "127.0.0.1"),
        port=getattr(args, "port", 30000),
        time_scale=args.time_scale,
        max_running_requests=args.max_running_requests,
        cuda_graph_max_bs=args.cuda_graph_max_bs,
        max_queued_requests=getattr(args, "max_queued_requests", None),
        context_length=getattr(args, "context_length", 131072),
        decode_log_interval=getattr(args, "decode_log_interval", 40),
        seed=args.seed,
        api_key=getattr(args, "api_key", None),
        stream_interval=getattr(args, "stream_interval", 1),
    )


def _emulate(args: argparse.Namespace) -> int:
    config = _config(args)
    if args.predict:
        from emulator.predict import as_json, predict, render

        prediction = predict(config, args.predict, args.input_len, args.output_len)
        if args.json:
            print(json.dumps(as_json(prediction), indent=1))
        else:
            print(render(prediction, f"{config.hardware.name}: predicted steady state"))
        return 0
    if args.mode is None:
        raise AcceptanceError("--mode spec|base is required to serve (or pass --predict)")
    from emulator.server import serve

    serve(config)
    return 0


def _demo(args: argparse.Namespace) -> int:
    from specroute.demo import DemoPlan, demo

    load_hardware(args.hardware)  # a bad name stops here, not in two servers
    extra = ("--accept-length", f"{args.accept_length:g}") if args.accept_length else ()
    plan = DemoPlan(
        hardware=args.hardware, time_scale=args.time_scale, peak=args.peak,
        phase_seconds=args.phase_seconds, out=Path(args.out), server_flags=extra,
    )  # fmt: skip
    demo(plan)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    command = {"emulate": _emulate, "demo": _demo, "serve": _serve, "bench": measure.run,
               "profile": measure.run, "calibrate": measure.run}[args.command]  # fmt: skip
    try:
        return command(args)
    except (HardwareError, AcceptanceError) as exc:
        print(f"specroute {args.command}: {exc}", file=sys.stderr)
        return 2
