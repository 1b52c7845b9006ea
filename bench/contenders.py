"""What a team could deploy on the same GPUs, each as the servers a user would start (their
``specroute emulate`` flags beside the model's) and the router's policy in front.

On one GPU group (``shared``):

- ``plain``: one server without speculation, all of the memory;
- ``eagle``: one EAGLE-3 server at its fixed depth, all of the memory;
- ``adaptive``: one EAGLE-3 server that chooses its depth by batch size
  (``--speculative-adaptive``, SGLang's default schedule), all of the memory;
- ``adaptive-calibrated``: the same with the schedule written from specroute's profile
  (``specroute adaptive-config``);
- ``specroute``: a speculative and a plain server on the same GPUs (their steps take turns;
  each loads the weights, the draft too on the speculative one, and each keeps SGLang's
  reserve: ``emulator.memory.shared_fractions``), routed by the crossover of its own servers
  as deployed (``crossover``, ``topology=shared``).

On two GPU groups (``partitioned``) each one-server deployment runs twice behind least-load
placement; specroute's pair has a group each, with all of its memory, routed by
``expected-latency`` (each request where its predicted time per output token is lowest);
and ``specroute-adaptive`` routes over two adaptive servers with the written schedule, the
first kept at the crossover (where it drafts) and the rest sent to the second
(``crossover``, ``topology=partitioned``).

Every server's KV cache is sized from memory as SGLang sizes it (``emulator.memory``), with
the model flags' ``--max-running-requests`` and CUDA-graph limit everywhere. Profiles are the
emulator's own predictions at the trace's mean lengths, as a perfect calibration would
measure them: of a speculative and a plain server each with all of the memory (the schedule
is written from it), and of the pair's two servers as deployed (what specroute routes by).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from specroute.emulator.config import EmulatorConfig
from specroute.emulator.memory import shared_fractions, static_gib
from specroute.emulator.predict import as_profile, predict
from specroute.model_flags import config_from_flags
from specroute.policies.crossover import Topology
from specroute.policies.policy import Policy
from specroute.policies.profile import Profile, parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.view import Pool
from specroute.profiler.adaptive_schedule import adaptive_schedule

LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the prediction's concurrencies
Mode = Literal["spec", "base"]


@dataclass(frozen=True)
class Server:
    pool: Pool  # where the router counts it
    mode: Mode  # ``specroute emulate --mode``: with a draft model or without
    flags: tuple[str, ...]  # beside the model's
    config: EmulatorConfig


@dataclass(frozen=True)
class Contender:
    name: str
    servers: tuple[Server, ...]
    policy: str  # the router's, by its registry name
    params: dict[str, str] = field(default_factory=dict)
    profile: dict[str, Any] | None = None  # the ``specroute.profile/v1`` it routes by

    def router(self) -> Policy:
        profile = None if self.profile is None else parse_profile(self.profile)
        return build_policy(self.policy, self.params, profile)


@dataclass(frozen=True)
class Setup:
    """One model's contenders, and what they were built from."""

    contenders: tuple[Contender, ...]
    profile: Profile  # both servers alone with all of the memory: the adaptive schedule's
    pair_profile: Profile | None  # the pair's servers as deployed, what specroute routes by
    schedule: dict[str, Any]
    capacity_tps: float  # the plain servers' output tok/s at their largest predicted level
    memory: dict[str, list[int | None]]  # each contender's servers' KV caches, in tokens
    unfit: dict[str, str]  # the contenders that cannot be deployed here, and why


def setup(
    model: Sequence[str],
    input_len: int,
    output_len: int,
    folder: Path,
    topology: Topology = "shared",
) -> Setup:
    """The contenders for the model of the flags ``model`` (``--mem-fraction-static`` given
    or not: SGLang's default here), the profile predicted at these lengths, and the schedule
    written from it (the files a server reads kept in ``folder``)."""
    model = (
        [*model] if "--mem-fraction-static" in model else [*model, "--mem-fraction-static", "auto"]
    )

    def server(pool: Pool, mode: Mode, *flags: str) -> Server:
        return Server(pool, mode, flags, config_from_flags([*model, *flags], mode))

    plain, spec = server("base", "base"), server("spec", "spec")
    prediction = predict(spec.config, list(LEVELS), input_len, output_len)
    raw = as_profile(prediction, spec.config)
    profile = parse_profile(raw)
    acceptance, graphs = spec.config.acceptance, spec.config.effective_cuda_graph_max_bs
    schedule = adaptive_schedule(profile, acceptance.steps, graphs)
    schedule_file = folder / "adaptive.json"
    schedule_file.write_text(json.dumps(schedule))
    adaptive = server("spec", "spec", "--speculative-adaptive")
    calibrated_flags = (
        "--speculative-adaptive",
        "--speculative-adaptive-config",
        str(schedule_file),
    )
    calibrated = server("spec", "spec", *calibrated_flags)
    groups = 1 if topology == "shared" else 2
    alone = {"plain": plain, "eagle": spec, "adaptive": adaptive, "adaptive-calibrated": calibrated}
    contenders = [
        Contender(name, (one,) * groups, f"always-{one.pool}") for name, one in alone.items()
    ]
    unfit: dict[str, str] = {}
    pair_raw: dict[str, Any] | None = raw
    if topology == "shared":
        try:
            spec_flags, base_flags = _shared_flags(spec.config, folder / "gpus")
            pair_spec, pair_base = (
                server("spec", "spec", *spec_flags),
                server("base", "base", *base_flags),
            )
        except ValueError as exc:  # the weights twice and two reserves leave no KV cache
            unfit["specroute"] = f"the pair does not fit on one GPU group: {exc}"
            pair_raw = None
        else:
            measured = predict(
                pair_spec.config, list(LEVELS), input_len, output_len, base=pair_base.config
            )
            pair_raw = as_profile(measured, pair_spec.config)
            pair = Contender(
                "specroute", (pair_spec, pair_base), "crossover", {"topology": "shared"}, pair_raw
            )
            contenders.append(pair)
    else:
        contenders += [
            Contender("specroute", (spec, plain), "expected-latency", profile=raw),
            Contender(
                "specroute-adaptive",
                (calibrated, server("base", "spec", *calibrated_flags)),
                "crossover",
                {"topology": "partitioned"},
                raw,
            ),
        ]
    memory = {c.name: [s.config.max_total_tokens for s in c.servers] for c in contenders}
    capacity = groups * prediction.levels[-1].base.total
    pair_profile = None if pair_raw is None else parse_profile(pair_raw)
    return Setup(tuple(contenders), profile, pair_profile, schedule, capacity, memory, unfit)


def _shared_flags(spec: EmulatorConfig, gpus: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The pair's flags on one GPU group, the speculative server started first: each holds
    the same memory and keeps SGLang's reserve for itself."""
    memory, fraction = spec.hardware.memory, spec.resolved_mem_fraction
    assert memory is not None and fraction is not None  # the model flags size the cache
    first, second = shared_fractions(fraction)
    taken = static_gib(memory, first)
    shared = ("--share-gpus", str(gpus))
    return (
        (*shared, "--mem-fraction-static", str(first)),
        (*shared, "--mem-fraction-static", str(second), "--memory-taken-gib", f"{taken:.4f}"),
    )
