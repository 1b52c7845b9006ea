"""What a team could deploy on the same GPUs instead of specroute, and specroute, on the same
production traffic, in virtual time: the head-to-head of ``specroute bench deployments``.

On one GPU group (one server's GPUs), each contender serves the same requests of the Azure LLM
inference trace 2023 (conversation half), open loop, at rates that put the group at stated
utilisations:

- ``plain``: one server without speculation, all of the memory;
- ``eagle``: one EAGLE-3 server at its fixed depth, all of the memory;
- ``adaptive``: one EAGLE-3 server that chooses its depth by batch size
  (``--speculative-adaptive``, SGLang's default schedule), all of the memory;
- ``adaptive-calibrated``: the same with the schedule written from specroute's profile
  (``specroute adaptive-config``);
- ``specroute``: a speculative and a plain server on the same GPUs (their steps take turns;
  each loads the weights, the draft too on the speculative one, and they split the memory
  evenly), routed by the crossover of its own servers as deployed (``crossover``,
  ``topology=shared``).

On two GPU groups (``partitioned``) each one-server deployment runs twice behind least-load
placement, and specroute's pair has a group each, with all of its memory, routed by
``expected-latency`` (each request where its predicted time per output token is lowest).

Every server's KV cache is sized from memory as SGLang sizes it (``emulator.memory``), with
the same ``--max-running-requests`` and CUDA-graph limit everywhere. Profiles are the
emulator's own predictions at the trace's mean lengths, as a perfect calibration would
measure them: of a speculative and a plain server each with all of the memory (the schedule
written for the adaptive server), and of the pair's two servers as deployed (what specroute
routes by). A utilisation is the trace's output tokens
a second over what the plain server delivers saturated (its largest predicted level, the
requests of the trace's mean lengths).
"""

from __future__ import annotations

import json
import math
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from specroute.bench.compare import summarise
from specroute.bench.replay import RoutedServer
from specroute.emulator.config import EmulatorConfig
from specroute.emulator.engine import Emission, Sequence, Step
from specroute.emulator.memory import Memory, static_gib
from specroute.emulator.predict import as_profile, predict
from specroute.emulator.virtual import VirtualTime
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.request_trace import RequestTrace
from specroute.policies.crossover import Topology
from specroute.policies.policy import Policy
from specroute.policies.profile import Profile, parse_profile
from specroute.policies.registry import build_policy
from specroute.policies.static import AlwaysPolicy
from specroute.policies.view import ConcurrencySource, Pool, RequestInfo, View
from specroute.profiler.adaptive_schedule import adaptive_schedule

_PATH = "/v1/chat/completions"
LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # the prediction's concurrencies
GPUS = "group"  # the one GPU group the shared pair takes turns on


@dataclass(frozen=True)
class Contender:
    name: str
    servers: tuple[tuple[Pool, EmulatorConfig], ...]
    policy: Policy


@dataclass(frozen=True)
class Setup:
    """One model's contenders, and what they were built from."""

    contenders: tuple[Contender, ...]
    profile: Profile  # both servers alone with all of the memory: the adaptive schedule's
    pair_profile: Profile  # the pair's servers as deployed: what specroute routes by
    schedule: dict[str, Any]
    capacity_tps: float  # the plain servers' output tok/s at their largest predicted level
    memory: dict[str, list[int | None]]  # each contender's servers' KV caches, in tokens


def setup(
    config: EmulatorConfig,
    input_len: int,
    output_len: int,
    folder: Path,
    topology: Topology = "shared",
) -> Setup:
    """The contenders for the model of ``config`` (its ``mem_fraction_static`` set or not:
    SGLang's default here), the profile predicted at these lengths, and the schedule
    written from it (kept in ``folder``). ``shared``: on one GPU group; ``partitioned``: on
    two, each one-server deployment twice behind least-load placement, and the pair on a
    group each."""
    config = replace(config, mem_fraction_static=config.mem_fraction_static or 0.0)
    plain, spec = replace(config, mode="base"), replace(config, mode="spec")
    prediction = predict(config, list(LEVELS), input_len, output_len)
    profile = parse_profile(as_profile(prediction, spec))
    steps, graphs = spec.acceptance.steps, spec.effective_cuda_graph_max_bs
    schedule = adaptive_schedule(profile, steps, graphs)
    schedule_file = folder / "adaptive.json"
    schedule_file.write_text(json.dumps(schedule))
    adaptive = replace(spec, speculative_adaptive=True)
    calibrated = replace(adaptive, speculative_adaptive_config=str(schedule_file))
    groups = 1 if topology == "shared" else 2
    alone: tuple[tuple[str, Pool, EmulatorConfig], ...] = (
        ("plain", "base", plain),
        ("eagle", "spec", spec),
        ("adaptive", "spec", adaptive),
        ("adaptive-calibrated", "spec", calibrated),
    )
    contenders = [
        Contender(name, ((pool, cfg),) * groups, AlwaysPolicy(pool)) for name, pool, cfg in alone
    ]
    # the pair routes by its own calibration (each of its servers measured as deployed), with
    # the policy the guide names for its topology: the crossover on shared GPUs; on GPUs of
    # their own, each request where its predicted time per output token is lowest
    if topology == "shared":
        first, second = _split(spec)
        pair_spec = replace(spec, share_gpus=GPUS, mem_fraction_static=first)
        taken = static_gib(_memory(spec), first)
        pair_base = replace(
            plain, share_gpus=GPUS, mem_fraction_static=second, memory_taken_gib=taken
        )
        measured = predict(pair_spec, list(LEVELS), input_len, output_len, base=pair_base)
        pair_profile = parse_profile(as_profile(measured, pair_spec))
        routing = build_policy("crossover", {"topology": "shared"}, pair_profile)
    else:
        pair_spec, pair_base, pair_profile = spec, plain, profile
        routing = build_policy("expected-latency", {}, pair_profile)
    pair: tuple[tuple[Pool, EmulatorConfig], ...] = (("spec", pair_spec), ("base", pair_base))
    contenders.append(Contender("specroute", pair, routing))
    memory = {c.name: [cfg.max_total_tokens for _, cfg in c.servers] for c in contenders}
    capacity = groups * prediction.levels[-1].base.total
    return Setup(tuple(contenders), profile, pair_profile, schedule, capacity, memory)


def _memory(config: EmulatorConfig) -> Memory:
    assert config.hardware.memory is not None
    return config.hardware.memory


def _split(spec: EmulatorConfig) -> tuple[float, float]:
    """The fractions that give two servers started one after the other on the same GPUs the
    same share of what one server with SGLang's default fraction would hold: the first's of
    the memory free at its start, the second's of what the first left."""
    memory = _memory(spec)
    fraction = spec.resolved_mem_fraction
    assert fraction is not None
    pre = memory.gpu_gib - memory.context_gib
    first = fraction / 2
    left = pre - static_gib(memory, first)
    return round(first, 4), round(pre * first / left, 4)


class _OpenLoop:
    """One contender serving a request trace: each request sent when the trace says, routed
    by the contender's policy from the router's view of its servers."""

    def __init__(self, contender: Contender, trace: RequestTrace, poll_interval: float) -> None:
        self.contender, self.trace, self.poll_interval = contender, trace, poll_interval
        self.servers = [
            RoutedServer(f"{pool}:{i}", pool, config)
            for i, (pool, config) in enumerate(contender.servers)
        ]
        self.time: VirtualTime[RoutedServer] = VirtualTime(self.deliver)
        self.records: list[RequestRecord] = []
        self.owners: dict[str, RequestRecord] = {}

    def run(self, until: float) -> list[RequestRecord]:
        for i, request in enumerate(self.trace.requests):
            self.time.at(request.at, partial(self.send, i))
        for k in range(math.ceil(until / self.poll_interval)):
            self.time.at(k * self.poll_interval, self.poll)
        self.time.run(until=until)
        return self.records

    def poll(self) -> None:
        for server in self.servers:
            server.poll()

    def send(self, i: int) -> None:
        request, now = self.trace.requests[i], self.time.now
        view = View(tuple(s.view() for s in self.servers), ConcurrencySource.ROUTER, now)
        output = max(1, request.output_tokens)
        info = RequestInfo(_PATH, max_tokens=output, prompt_tokens=request.prompt_tokens)
        decision = self.contender.policy.choose(info, view)
        server = next(s for s in self.servers if s.name == decision.backend)
        seq = Sequence(f"t{i}", f"trace {i}", request.prompt_tokens, output, ignore_eos=True)
        record = RequestRecord(self.contender.name, 0, 0, now, served_by=server.name)
        record.prompt_tokens = request.prompt_tokens
        self.records.append(record)
        self.owners[seq.rid] = record
        self.time.submit(server, seq)
        server.add(now, 1)

    def deliver(self, server: RoutedServer, step: Step) -> None:
        for emission in step.emitted:
            self.answer(server, emission)

    def answer(self, server: RoutedServer, emission: Emission) -> None:
        record, now = self.owners[emission.seq.rid], self.time.now
        if emission.ids:
            if record.first_token is None:
                record.first_token = now
            record.chunks.append((now, len(emission.ids)))
        if emission.finish is None:
            return
        seq = emission.seq
        del self.owners[seq.rid]
        record.end, record.output_tokens = now, len(seq.output_ids)
        server.add(now, -1)
        server.tokens += len(seq.output_ids)
        server.verifies += seq.verify_ct


def serve(
    contender: Contender, trace: RequestTrace, until: float, poll_interval: float = 0.5
) -> list[RequestRecord]:
    """Every request of ``trace`` through ``contender``, in virtual seconds from 0, cut at
    ``until`` (a request not finished by then has no end)."""
    return _OpenLoop(contender, trace, poll_interval).run(until)


def head_to_head(
    config: EmulatorConfig,
    trace: RequestTrace,
    utilisations: list[float],
    slo: dict[str, float],
    progress: Callable[[str], None] = lambda _: None,
    topology: Topology = "shared",
) -> dict[str, Any]:
    """Each contender at each utilisation: its figures over the trace's span (requests not
    finished by twice the span are counted unfinished)."""
    prompts = statistics.mean(r.prompt_tokens for r in trace.requests)
    outputs = statistics.mean(r.output_tokens for r in trace.requests)
    with tempfile.TemporaryDirectory() as folder:
        built = setup(config, int(prompts), int(outputs), Path(folder), topology)
        demand = sum(r.output_tokens for r in trace.requests) / trace.seconds
        rows: dict[str, dict[str, Any]] = {}
        for utilisation in utilisations:
            factor = utilisation * built.capacity_tps / demand
            offered = trace.scaled(factor)
            span = offered.seconds
            row: dict[str, Any] = {"rate_factor": round(factor, 4), "rate": round(offered.rate, 3)}
            for contender in built.contenders:
                records = serve(contender, offered, 2 * span)
                figures = summarise(records, 0.0, span, slo)
                figures["unfinished"] = sum(1 for r in records if r.end is None)
                row[contender.name] = figures
                progress(
                    f"utilisation {utilisation:g}: {contender.name} {figures['output_tps']} tok/s, "
                    f"TPOT p50 {figures['tpot_ms_p50']} ms, TTFT p99 {figures['ttft_ms_p99']} ms"
                )
            rows[f"{utilisation:g}"] = row
    return {
        "hardware": config.hardware.name,
        "topology": topology,
        "trace": trace.describe(),
        "slo": slo,
        "capacity_tps": round(built.capacity_tps, 2),
        "crossover": _crossing(built.profile),
        "pair_crossover": _crossing(built.pair_profile),
        "schedule": built.schedule,
        "kv_tokens": built.memory,
        "contenders": [c.name for c in built.contenders],
        "utilisations": rows,
    }


def _crossing(profile: Profile) -> dict[str, Any]:
    crossover = profile.crossover
    return {"value": crossover.value, "bound": crossover.bound, "limit": crossover.limit}


COLUMNS = (
    ("output_tps", "tok/s"),
    ("tpot_ms_p50", "TPOT p50"),
    ("tpot_ms_p99", "TPOT p99"),
    ("ttft_ms_p50", "TTFT p50"),
    ("ttft_ms_p99", "TTFT p99"),
    ("goodput_rps", "goodput/s"),
)


def rows(document: dict[str, Any], mark: Callable[[str], str] = "{}*".format) -> list[list[str]]:
    """A row a utilisation and contender: the figures of ``COLUMNS`` (times in ms), and the
    best of each column at its utilisation ``mark``ed (a star)."""
    out = []
    for utilisation, row in document["utilisations"].items():
        names = document["contenders"]
        best = {key: _best(key, [row[n][key] for n in names]) for key, _ in COLUMNS}
        for name in names:
            figures = row[name]
            cells = [
                _cell(figures[key], figures[key] == best[key] and best[key] is not None, mark)
                for key, _ in COLUMNS
            ]
            unfinished = figures.get("unfinished") or 0
            out.append([utilisation, name, *cells, str(unfinished)])
    return out


def _best(key: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    higher = key in ("output_tps", "goodput_rps")
    return max(present) if higher else min(present)


def _cell(value: Any, best: bool, mark: Callable[[str], str]) -> str:
    text = "-" if value is None else f"{value:g}"
    return mark(text) if best else text


def render(document: dict[str, Any]) -> str:
    header = ["util.", "contender", *(label for _, label in COLUMNS), "unfinished"]
    lines = [
        f"{document['hardware']}: {document['trace']['source']}",
        f"the plain server saturated: {document['capacity_tps']} tok/s; the crossover of "
        f"servers with all of the memory: {document['crossover']['value']}, of the pair as "
        f"deployed: {document['pair_crossover']['value']}; SLO {document['slo']}",
        "  ".join(header),
    ]
    lines += ["  ".join(row) for row in rows(document)]
    return "\n".join(lines)
