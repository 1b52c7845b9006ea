"""Argument types and flag groups that several commands share."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specroute.loadgen.dataset import Dataset
    from specroute.loadgen.sweep import SweepPlan

    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]

_SLO_KEYS = ("ttft", "tpot")


def _counts(text: str, example: str, what: str) -> list[int]:
    """Comma-separated positive integers, ascending and distinct."""
    try:
        found = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers like {example}, got {text!r}"
        ) from None
    if not found or min(found) < 1:
        raise argparse.ArgumentTypeError(f"{what} must be >= 1, got {text!r}")
    return sorted(set(found))


def levels(text: str) -> list[int]:
    return _counts(text, "1,2,4,8", "concurrency levels")


def lengths(text: str) -> list[int]:
    """``512,4096,16384``: prompt lengths in tokens, ascending, one context bucket each."""
    return _counts(text, "512,4096", "prompt lengths")


def slo(text: str) -> dict[str, float]:
    """``ttft=0.5,tpot=50ms``: seconds, or milliseconds with ``ms``."""
    found = {}
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in _SLO_KEYS:
            raise argparse.ArgumentTypeError(f"SLO keys are {', '.join(_SLO_KEYS)}; got {key!r}")
        try:
            seconds = float(value[:-2]) / 1000 if value.endswith("ms") else float(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"bad SLO value {value!r} for {key}") from None
        found[key] = seconds
    return found


def add_workload_flags(p: argparse.ArgumentParser, contexts: bool = False) -> None:
    """``contexts``: ``--input-len`` takes a list, one context bucket per length."""
    p.add_argument("--spec", required=True, metavar="URL", help="the speculative server")
    p.add_argument("--base", required=True, metavar="URL", help="the plain server")
    add_dataset_flags(p, contexts)
    size = p.add_mutually_exclusive_group()
    size.add_argument(
        "--requests-per-level",
        type=int,
        metavar="N",
        help="measured requests per level and run (default: 2x the level, at least 16)",
    )
    size.add_argument("--duration-per-level", type=float, metavar="S")
    p.add_argument("--repeats", type=int, default=3, help="runs per level and backend")


def add_dataset_flags(p: argparse.ArgumentParser, contexts: bool = False) -> None:
    p.add_argument(
        "--dataset",
        nargs="+",
        default=["synthetic"],
        metavar="KIND [FILE]",
        help="synthetic (default), sharegpt FILE, or jsonl FILE (your own prompts)",
    )
    if contexts:
        p.add_argument(
            "--input-len",
            type=lengths,
            default=[512],
            metavar="N[,N...]",
            help="synthetic prompt tokens; several: the crossover per context, one budget",
        )
    else:
        p.add_argument("--input-len", type=int, default=512, help="synthetic prompt tokens")
    p.add_argument("--output-len", type=int, default=256, help="output tokens per request")
    p.add_argument(
        "--slo",
        type=slo,
        default={},
        metavar="ttft=S,tpot=S",
        help="service-level objectives for goodput, e.g. ttft=0.5,tpot=50ms",
    )
    p.add_argument(
        "--no-ignore-eos",
        dest="ignore_eos",
        action="store_false",
        help="let requests stop at end of sequence (lengths then vary)",
    )
    p.add_argument("--seed", type=int, default=0)


def add_report_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("-o", "--output", required=True, metavar="profile.json")
    p.add_argument("--report", metavar="report.md", help="the profile in words")
    p.add_argument("--plot", metavar="crossover.png", help="needs matplotlib")


def dataset(args: argparse.Namespace, input_len: int | None = None) -> Dataset:
    """``input_len``: the synthetic prompts' length, when ``--input-len`` gave several."""
    from specroute.loadgen.dataset import jsonl, sharegpt, synthetic

    kind, *rest = args.dataset
    if kind == "synthetic" and not rest:
        length = args.input_len if input_len is None else input_len
        dataset = synthetic(length, args.output_len, seed=args.seed)
    elif kind == "sharegpt" and len(rest) == 1:
        dataset = sharegpt(Path(rest[0]), args.output_len if args.ignore_eos else None)
    elif kind == "jsonl" and len(rest) == 1:
        dataset = jsonl(Path(rest[0]), args.output_len)
    else:
        raise ValueError("--dataset takes synthetic, sharegpt FILE or jsonl FILE")
    return dataset


def sweep_plan(args: argparse.Namespace, input_len: int | None = None) -> SweepPlan:
    from specroute.loadgen.sweep import SweepPlan

    return SweepPlan(
        spec=args.spec.rstrip("/"),
        base=args.base.rstrip("/"),
        dataset=dataset(args, input_len),
        repeats=args.repeats,
        requests=args.requests_per_level,
        duration=args.duration_per_level,
        ignore_eos=args.ignore_eos,
        slo=args.slo,
        api_key=os.environ.get("SPECROUTE_BENCH_API_KEY"),
    )
