"""The flags that describe one emulated server (hardware, acceptance, batch limits) and the
settings they resolve to, shared by ``emulate`` and the offline comparison."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Literal

from specroute.emulator.accept_schedule import parse_schedule
from specroute.emulator.acceptance import Acceptance, AcceptanceError, accept_rate, parse_rules
from specroute.emulator.adaptive import (
    SKIP_ZERO_STEP_DRAFT_EXTEND,
    candidate_depths,
    read_schedule,
)
from specroute.emulator.config import EmulatorConfig
from specroute.emulator.faults import parse_faults
from specroute.emulator.hardware import load_hardware
from specroute.emulator.noise import Noise, NoiseError, parse_noise


def positive(kind: type[int] | type[float]) -> argparse._ActionType:
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text!r}")
        return value

    return parse


def _noise(text: str) -> Noise:
    try:
        return parse_noise(text)
    except NoiseError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_model_flags(p: argparse.ArgumentParser, seed: bool = True) -> None:
    """The flags that make an emulated server: its hardware model and speculation, then what
    it runs as (``_add_serving_flags``)."""
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
    p.add_argument(
        "--accept-schedule",
        metavar="T:TAU,...",
        help="the accept length changes to TAU at T seconds of emulated time since the "
        'server started, each in turn (e.g. "0:3.0,30:1.6")',
    )
    p.add_argument("--speculative-num-steps", type=positive(int), metavar="S")
    p.add_argument(
        "--speculative-adaptive",
        action="store_true",
        help="choose the draft depth per decode batch as SGLang 0.5.23's flag does (EAGLE "
        "servers only; SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1 skips the draft's extend "
        "at depth 0, as SGLang's)",
    )
    p.add_argument(
        "--speculative-adaptive-config",
        metavar="FILE",
        help="the adaptive schedule, as SGLang's flag (JSON: candidate depths by batch size); "
        "default: SGLang's",
    )
    _add_serving_flags(p)
    if seed:  # a command with a dataset has its own, which serves both
        p.add_argument("--seed", type=int, default=0)


def _add_serving_flags(p: argparse.ArgumentParser) -> None:
    """Its batch and memory limits, noise, shared GPUs, and the SGLang features it models."""
    p.add_argument(
        "--max-running-requests",
        type=positive(int),
        metavar="N",
        help="default: 48 with speculation (as SGLang), the model's without",
    )
    p.add_argument(
        "--cuda-graph-max-bs-decode",
        "--cuda-graph-max-bs",
        dest="cuda_graph_max_bs",
        type=positive(int),
        metavar="N",
        help="largest batch run as a CUDA graph (SGLang 0.5.23's name; the older one works)",
    )
    p.add_argument(
        "--mem-fraction-static",
        type=_fraction,
        metavar="F",
        help="size the KV cache from the hardware model's memory as SGLang does: F of each "
        "GPU's free memory for the weights and the cache ('auto': SGLang's default); a "
        "request waits for room and running ones are retracted when decoding runs out. "
        "Default: the KV cache is no limit",
    )
    p.add_argument(
        "--memory-taken-gib",
        type=float,
        default=0.0,
        metavar="GIB",
        help="each GPU's memory that servers started before this one on the same GPUs hold "
        "(the shared topology: what SGLang finds taken when it starts)",
    )
    p.add_argument(
        "--noise",
        type=_noise,
        default=Noise(),
        metavar="run=S,step=S",
        help="timing noise like a real engine's (off by default): the log-sigma of a "
        "multiplier drawn per run (each time the server starts work after idling) and of one "
        "drawn per step; 'default' is run=0.02,step=0.05. Seeded by --seed",
    )
    p.add_argument(
        "--share-gpus",
        metavar="FILE",
        help="servers given the same file share one set of GPUs (the shared topology): their "
        "steps take turns, as CUDA time-slices two processes on one GPU. Default: GPUs of "
        "its own",
    )
    p.add_argument(
        "--radix-cache-tokens",
        type=int,
        default=0,
        metavar="N",
        help="model SGLang's radix cache, holding N prompt tokens (least recently used "
        "evicted first): a prompt's cached prefix is not prefilled again. Default 0: no "
        "prefix caching",
    )
    p.add_argument(
        "--enable-cache-report",
        action="store_true",
        help="report cached prompt tokens in the OpenAI usage, as SGLang's flag",
    )
    p.add_argument(
        "--enable-response-store",
        action="store_true",
        help="keep /v1/responses answers, to go on from by previous_response_id and to "
        "retrieve or cancel, as SGLang's flag",
    )


def emulator_config(
    args: argparse.Namespace, mode: Literal["spec", "base"] | None = None
) -> EmulatorConfig:
    """One emulated server's settings from ``emulate`` or ``bench compare --offline`` flags."""
    _adaptive_depth_offered(args, mode or getattr(args, "mode", None) or "base")
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
    return _checked(
        EmulatorConfig(
            mode=mode or getattr(args, "mode", None) or "base",
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
            faults=parse_faults(getattr(args, "fault", None) or ()),
            noise=getattr(args, "noise", None) or Noise(),
            share_gpus=getattr(args, "share_gpus", None),
            radix_cache_tokens=_cache_size(getattr(args, "radix_cache_tokens", 0)),
            enable_cache_report=getattr(args, "enable_cache_report", False),
            enable_response_store=getattr(args, "enable_response_store", False),
            accept_schedule=parse_schedule(args.accept_schedule, steps)
            if args.accept_schedule
            else (),
            speculative_adaptive=getattr(args, "speculative_adaptive", False),
            speculative_adaptive_config=_schedule_file(
                getattr(args, "speculative_adaptive_config", None)
            ),
            skip_zero_step_draft_extend=_env_flag(SKIP_ZERO_STEP_DRAFT_EXTEND),
            mem_fraction_static=args.mem_fraction_static,
            memory_taken_gib=args.memory_taken_gib,
        )
    )


def _checked(config: EmulatorConfig) -> EmulatorConfig:
    """The memory model asked for only where the hardware model states memory, and weights
    that leave the KV cache room (SGLang refuses to start otherwise)."""
    if config.mem_fraction_static is not None and config.hardware.memory is None:
        raise ValueError(
            f"--mem-fraction-static: the hardware model {config.hardware.name} states no memory"
        )
    _ = config.max_total_tokens
    return config


def _fraction(text: str) -> float:
    """``--mem-fraction-static``: a share in (0, 1), or ``auto`` (0: SGLang's default)."""
    if text == "auto":
        return 0.0
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction or 'auto', got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text!r}")
    return value


def _adaptive_depth_offered(args: argparse.Namespace, mode: str) -> None:
    """SGLang's check at a speculative server's start: the depth given
    (``--speculative-num-steps``) is one its adaptive schedule offers, or it refuses to
    start, in its words."""
    steps = getattr(args, "speculative_num_steps", None)
    if mode != "spec" or not getattr(args, "speculative_adaptive", False) or steps is None:
        return
    offered = candidate_depths(read_schedule(getattr(args, "speculative_adaptive_config", None)))
    if steps not in offered:
        raise ValueError(
            f"--speculative-num-steps={steps} is not in the adaptive config candidate_steps "
            f"{offered}. Pass one of those values."
        )


def _schedule_file(path: str | None) -> str | None:
    """The schedule's file, checked now: SGLang refuses a bad one at start."""
    if path is not None:
        read_schedule(path)
    return path


def _env_flag(name: str) -> bool:
    """As SGLang reads a boolean from its environment: a value it cannot read stops the
    start."""
    value = os.environ.get(name, "false").lower()
    if value not in ("true", "1", "yes", "y", "false", "0", "no", "n"):
        raise ValueError(f"{name}={value!r} is not a valid boolean value")
    return value in ("true", "1", "yes", "y")


def _cache_size(tokens: int) -> int:
    if tokens < 0:
        raise ValueError(f"--radix-cache-tokens {tokens}: give 0 (no cache) or more tokens")
    return tokens


def given_model_flags(args: argparse.Namespace) -> list[str]:
    """The model flags ``args`` were parsed from, as far as they differ from the defaults:
    to start other servers of the same model (``config_from_flags`` reads them back)."""
    parser = argparse.ArgumentParser()
    add_model_flags(parser)
    flags: list[str] = []
    for action in parser._actions:
        value = getattr(args, action.dest, action.default)
        if not action.option_strings or value == action.default:
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            flags.append(flag)
        elif isinstance(value, Noise):
            flags += [flag, f"run={value.run},step={value.step}"]
        elif action.dest == "mem_fraction_static" and value == 0.0:
            flags += [flag, "auto"]
        else:
            flags += [flag, str(value)]
    return flags


def config_from_flags(
    flags: Sequence[str], mode: Literal["spec", "base"], time_scale: float = 1.0
) -> EmulatorConfig:
    """The settings of a server started with these model flags, for a replay beside it."""
    parser = argparse.ArgumentParser()
    add_model_flags(parser)
    args = parser.parse_args(list(flags))
    args.time_scale = time_scale
    return emulator_config(args, mode)
