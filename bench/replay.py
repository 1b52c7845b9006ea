"""The offline comparison: a trace replayed in virtual time through the emulator's engine
model and the router's policies, without HTTP, so a day of traffic takes seconds.

Each backend is one engine (the same code an emulated server runs) whose steps advance a
shared virtual clock instead of being slept. Clients and arrivals follow the trace exactly
as ``bench compare`` plays it live; each request is routed by the policy from a view built
as the router builds its own: its in-flight counts, and running, queued and the windowed
accept length (from counters updated when requests finish, as SGLang's are) read every
``poll_interval``, and the estimated context (KV tokens) of its requests in flight, each
estimated from its body as the router does. A step's answers reach their clients when it
ends, after the engine has chosen its next batch, so a replacement joins the batch after
the next, as in ``--predict``.

The oracle knows each phase's load before it comes and sends the phase's requests to the
static choice that turns out faster there (lower median time per output token, from the
replays of both); the gap of a policy to it is what knowing the load would still gain.
It is the best static choice per phase, not the best possible routing: a policy that
splits a phase between both servers can beat it.
"""

from __future__ import annotations

import math
import random
import statistics
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from specroute.bench.compare import over_time, policy_summary
from specroute.bench.learning import Learning
from specroute.emulator.config import EmulatorConfig
from specroute.emulator.engine import Emission, Step
from specroute.emulator.openai_api import parse
from specroute.emulator.virtual import VirtualServer, VirtualTime
from specroute.loadgen.client import PhaseBodies
from specroute.loadgen.dataset import Dataset, words_text
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.request_trace import RequestTrace, TracedRequest
from specroute.loadgen.trace import Trace
from specroute.loadgen.trace_loop import IDLE_POLL, TRACE_ENDED
from specroute.online.exploration import policy_bands
from specroute.online.samples import Reading, Sample, decoded_under
from specroute.policies.decision import Decision
from specroute.policies.policy import Policy, pick
from specroute.policies.static import AlwaysPolicy
from specroute.policies.view import (
    POOLS,
    TOKENS_PER_BYTE,
    BackendView,
    ConcurrencySource,
    Pool,
    RequestInfo,
    View,
)
from specroute.router.backends.backend import backend_name
from specroute.router.proxy.request import request_info

_PATH = "/v1/chat/completions"
_GOLDEN = 0.6180339887  # spreads the clients' polling beats evenly


@dataclass(frozen=True)
class ReplayPlan:
    trace: Trace
    dataset: Dataset
    servers: dict[Pool, EmulatorConfig]  # one engine per URL below
    backends: dict[Pool, tuple[str, ...]]  # the router config's URLs, for names only
    source: ConcurrencySource = ConcurrencySource.ROUTER
    poll_interval: float = 0.5
    slo: dict[str, float] = field(default_factory=dict)
    ignore_eos: bool = True
    settle: float = 0.0  # seconds of each phase left out of its figures
    seed: int = 0
    output_len: int = 256  # the answers of prompts a phase names by length
    # a request trace's arrivals and lengths, sent besides the phases' (the Azure trace's)
    requests: RequestTrace | None = None


class RoutedServer(VirtualServer):
    """One backend: its engine on the clock, and what the router knows of it."""

    def __init__(self, name: str, pool: Pool, config: EmulatorConfig) -> None:
        super().__init__(name, config, config.time_scale)
        self.pool = pool
        self.group = ""  # the one GPU group, as the router places servers given by URL
        self.inflight = 0
        self.lived_for = 0.0  # its in-flight count integrated over time up to ``changed``
        self.changed = 0.0  # when the count last changed
        self.kv_tokens = 0  # the estimated context of those in flight, as the router's
        self.prompts = 0  # the estimated prompt tokens sent here so far, as the router's
        self.tokens = self.verifies = 0  # at finish, as SGLang counts them
        self.polled = (0, 0)
        self.running: int | None = None
        self.queued: int | None = None
        self.accept_length: float | None = None

    def lived(self, now: float) -> float:
        """Its in-flight count integrated over time up to ``now``, as the router's board."""
        return self.lived_for + self.inflight * (now - self.changed)

    def others(self, now: float) -> float:
        """The other routers' requests here: one router in the replay, none."""
        return 0.0

    def others_lived(self, now: float) -> float:
        return 0.0

    def prompted(self) -> float:
        return float(self.prompts)

    def add(self, now: float, n: int) -> None:
        self.lived_for, self.changed = self.lived(now), now
        self.inflight += n

    def poll(self) -> None:
        tokens, verifies = self.tokens - self.polled[0], self.verifies - self.polled[1]
        if verifies > 0:
            self.accept_length = tokens / verifies
        self.polled = (self.tokens, self.verifies)
        self.running, self.queued = len(self.engine.running), len(self.engine.waiting)

    def view(self) -> BackendView:
        """As the router sees it: no ``max_running_requests`` (a policy takes the profile's)."""
        return BackendView(
            self.name,
            self.pool,
            True,
            self.inflight,
            self.running,
            self.queued,
            self.accept_length,
            kv_tokens=self.kv_tokens,
        )


class _Replay:
    def __init__(
        self, plan: ReplayPlan, policy: Policy, label: str, learning: Learning | None = None
    ) -> None:
        self.plan, self.policy, self.label, self.learning = plan, policy, label, learning
        if learning is not None:
            learning.online.shared = learning.shared  # before the first fit says so too
        self.servers = [
            RoutedServer(backend_name(url, pool), pool, plan.servers[pool])
            for pool in plan.backends
            for url in plan.backends[pool]
        ]
        self.time: VirtualTime[RoutedServer] = VirtualTime(self.deliver)
        spans = plan.trace.spans(plan.settle)
        self.ends = [end for *_, end in spans]
        self.windows = sorted({t for span in spans for t in span})  # where figures are cut
        self.records: list[RequestRecord] = []
        # by rid: its record, client, KV tokens and the load it joined
        self.owners: dict[str, tuple[RequestRecord, int | None, int, int]] = {}
        # by rid, from its first token: when it came, and the load lived and the prompts
        # sent by then
        self.decoding: dict[str, tuple[float, Reading]] = {}
        # the profile's ratio, as the router takes it (a policy that routes by context has it)
        self.tokens_per_byte: float = getattr(policy, "tokens_per_byte", TOKENS_PER_BYTE)
        self.idle = [True] * plan.trace.peak
        self.bodies = PhaseBodies(
            plan.trace, plan.dataset, "replay", plan.ignore_eos, plan.output_len, plan.seed
        )

    @property
    def now(self) -> float:
        return self.time.now

    def phase(self, t: float) -> int:
        return bisect_right(self.ends, t)

    def window(self, t: float) -> int:
        return bisect_right(self.windows, t)

    def run(self) -> list[RequestRecord]:
        trace = self.plan.trace
        for i, (start, *_) in enumerate(trace.spans()):
            self.time.at(start, partial(self.fill, i))
        for t in trace.arrivals(self.plan.seed):
            self.time.at(t, lambda: self.send(None))
        if self.plan.requests is not None:
            rng = random.Random(f"traced|{self.plan.seed}")
            for request in self.plan.requests.requests:
                body = traced_body(request, rng)
                self.time.at(request.at, partial(self.send, None, body))
        for k in range(math.ceil(trace.seconds / self.plan.poll_interval)):
            self.time.at(k * self.plan.poll_interval, self.poll)
        for server in self.servers:
            self.time.follow_schedule(server)  # an accept length that drifts, if it does
        if (learning := self.learning) is not None:
            for k in range(1, math.ceil(trace.seconds / learning.interval)):
                self.time.at(k * learning.interval, partial(self.refit, k * learning.interval))
        self.time.run(until=trace.seconds)
        for record in self.records:
            if record.end is None:
                record.error = TRACE_ENDED
        return self.records

    def poll(self) -> None:
        for server in self.servers:
            server.poll()

    def refit(self, now: float) -> None:
        """The estimator's fit, at the speculative servers' accept length as last polled,
        read as the router's fit reads it."""
        assert self.learning is not None
        view = View(tuple(s.view() for s in self.servers), self.plan.source, now)
        self.learning.refit(now, view.accept_length())

    def fill(self, phase: int) -> None:
        """A concurrency phase begins: its idle clients start sending when they next look,
        as live ones do (each polls on its own beat; at the trace's start all are ready)."""
        for k in range(self.plan.trace.phases[phase].concurrency):
            if self.idle[k]:
                self.idle[k] = False
                beat = IDLE_POLL * ((k + 1) * _GOLDEN % 1.0) if self.now > 0 else 0.0
                self.time.at(self.now + beat, partial(self.send, k))

    def send(self, client: int | None, body: dict[str, Any] | None = None) -> None:
        phase = self.phase(self.now)
        body = self.bodies(phase) if body is None else body
        learning = self.learning
        live = () if learning is None else learning.online.live_bands
        view = View(tuple(s.view() for s in self.servers), self.plan.source, self.now, live)
        info = request_info(_PATH, body)
        decision = self.policy.choose(info, view)
        if learning is not None and learning.exploration is not None:
            decision = learning.exploration.after(decision, view, policy_bands(self.policy))
        server = next(s for s in self.servers if s.name == decision.backend)
        config = server.config
        seq = parse(body, chat=True, context_length=config.context_length).seq
        record = RequestRecord(
            self.label,
            self.plan.trace.phases[phase].concurrency,
            phase,
            self.now,
            served_by=server.name,
            measured=True,
        )
        self.records.append(record)
        prompt, context = info.tokens(self.tokens_per_byte)
        joined = 0 if learning is None else learning.online.joined(self.servers, server)
        self.owners[seq.rid] = (record, client, context, joined)
        self.time.submit(server, seq)
        server.add(self.now, 1)
        server.kv_tokens += context
        server.prompts += prompt

    def deliver(self, server: RoutedServer, step: Step) -> None:
        for emission in step.emitted:
            self.answer(server, emission)

    def answer(self, server: RoutedServer, emission: Emission) -> None:
        record, client, context, joined = self.owners[emission.seq.rid]
        if emission.ids:
            if record.first_token is None:
                record.first_token = self.now
                self.decoding[emission.seq.rid] = (self.now, self.lived(server))
            n = len(emission.ids)
            last = record.chunks[-1] if record.chunks else None
            if last is not None and self.window(last[0]) == self.window(self.now):
                record.chunks[-1] = (self.now, last[1] + n)  # one chunk per window is enough
            else:
                record.chunks.append((self.now, n))
        if emission.finish is None:
            return
        seq = emission.seq
        del self.owners[seq.rid]
        record.end, record.output_tokens = self.now, len(seq.output_ids)
        record.prompt_tokens = seq.prompt_tokens
        load, beside, prefill = self.load(server, seq.rid, joined, len(seq.output_ids))
        server.add(self.now, -1)
        server.kv_tokens -= context
        server.tokens += len(seq.output_ids)
        server.verifies += seq.verify_ct
        if self.learning is not None and (tpot := record.tpot()) is not None:
            accept = server.accept_length if server.pool == "spec" else None
            sample = Sample(
                self.now, server.pool, load, tpot, context, accept, beside, None, prefill
            )
            self.learning.online.record(sample)  # as the router does at a request's end
        if client is None:
            return
        phase = self.phase(self.now)
        phases = self.plan.trace.phases
        if phase < len(phases) and client < phases[phase].concurrency:
            self.send(client)
        else:
            self.idle[client] = True

    def lived(self, server: RoutedServer) -> Reading:
        """The load the online samples count at ``server`` integrated over time up to now:
        its pool's part and the other pool's beside it, and the prompts sent to its GPUs
        (``Online.lived``)."""
        if self.learning is None:
            return 0.0, 0.0, 0.0
        gauge = self.learning.online.lived(self.servers, server)
        return (0.0, 0.0, 0.0) if gauge is None else gauge(self.now)

    def load(
        self, server: RoutedServer, rid: str, joined: int, tokens: int
    ) -> tuple[float, float, float | None]:
        """The mean load a request of ``tokens`` output tokens decoded under, itself
        included (``joined`` when it had no time decoding), the other pool's part of it, and
        the prompt tokens sent to its GPUs meanwhile per output token after its first (None:
        unknown)."""
        start = self.decoding.pop(rid, None)
        if start is None or self.now <= start[0]:
            return float(joined), 0.0, None
        return decoded_under(start[1], self.lived(server), self.now - start[0], tokens)


def traced_body(request: TracedRequest, rng: random.Random) -> dict[str, Any]:
    """A traced request's body: a prompt of about its prompt tokens (a word a token), its
    output tokens asked for and produced to the end."""
    text = words_text(rng, max(1, request.prompt_tokens))
    return {
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max(1, request.output_tokens),
        "ignore_eos": True,
    }


def replay(
    plan: ReplayPlan, policy: Policy, label: str | None = None, learning: Learning | None = None
) -> list[RequestRecord]:
    """Every request of one policy over the trace, with virtual times from 0; with
    ``learning``, the router's online estimator learns from the requests served, and routes
    by its crossover when it adopts one."""
    return _Replay(plan, policy, label or policy.name, learning).run()


class Oracle:
    """Knows the load of every phase before it comes, and which static choice serves each
    faster: routes every request begun in a phase to that choice's pool."""

    name = "oracle"

    def __init__(self, trace: Trace, choice: list[Pool]) -> None:
        self.trace, self.choice = trace, choice

    def choose(self, request: RequestInfo, view: View) -> Decision:
        phase = self.trace.phase_at(view.now)
        return pick(view, self.choice[phase or 0], "oracle")

    def crossover(self) -> float | None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"choice": self.choice}


def oracle(plan: ReplayPlan, spec: list[RequestRecord], base: list[RequestRecord]) -> Oracle:
    """The oracle from both static replays: per phase, the lower median TPOT."""
    choice: list[Pool] = []
    for i in range(len(plan.trace.phases)):
        faster = _median_tpot(spec, i) <= _median_tpot(base, i)
        choice.append("spec" if faster else "base")
    return Oracle(plan.trace, choice)


def _median_tpot(records: list[RequestRecord], phase: int) -> float:
    tpots = [t for r in records if r.repeat == phase and (t := r.tpot()) is not None]
    return statistics.median(tpots) if tpots else math.inf


def compare_offline(
    plan: ReplayPlan,
    policies: dict[str, Policy],
    progress: Callable[[str], None] | None = None,
    learning: Callable[[], Learning] | None = None,
) -> dict[str, Any]:
    """The same results as a live comparison (per phase and overall, each policy), plus
    the oracle and each policy's gap to it. Both static choices run whether asked for or
    not: the oracle is made of them. ``learning``: a fresh online estimator for each policy
    asked for (``--online adopt`` in the router's config), whose fits are in ``online``."""
    statics = {f"always-{pool}": AlwaysPolicy(pool) for pool in POOLS}
    everyone = policies | {name: p for name, p in statics.items() if name not in policies}
    runs: dict[str, list[RequestRecord]] = {}
    learned: dict[str, Learning] = {}
    for name, policy in everyone.items():
        if learning is not None and name in policies:
            learned[name] = learning()
            topology = getattr(getattr(policy, "params", None), "topology", "shared")
            learned[name].shared = topology != "partitioned"  # the load it joins, as counted
        runs[name] = replay(plan, policy, name, learned.get(name))
        if progress is not None:
            progress(f"{name}: {len(runs[name])} requests replayed")
    best = oracle(plan, runs["always-spec"], runs["always-base"])
    runs["oracle"] = replay(plan, best)
    results: dict[str, Any] = {
        "mode": "offline",
        "trace": {"name": plan.trace.name, "phases": [vars(p) for p in plan.trace.phases]},
        "slo": plan.slo,
        "settle_seconds": plan.settle,
        "dataset": plan.dataset.describe(),
        "backends": {
            pool: {
                "hardware": c.hardware.name,
                "time_scale": c.time_scale,
                "max_running_requests": c.effective_max_running,
                "accept_rate": c.acceptance.rate,
                "count": len(plan.backends[pool]),
            }
            for pool, c in plan.servers.items()
        },
        "policies": {},
        "oracle": best.describe(),
    }
    if learned:  # each fit: its time, the crossover routed by (None: the profile's), drift
        results["online"] = {name: learning.history for name, learning in learned.items()}
        results["online_live"] = {name: learning.live for name, learning in learned.items()}
        first = next(iter(learned.values())).profile
        if first is not None:
            c = first.crossover
            results["online_profile"] = {"value": c.threshold, "ci": c.ci}
        results["accept_schedule"] = [vars(c) for c in plan.servers["spec"].accept_schedule]
    for name, records in runs.items():
        results["policies"][name] = policy_summary(
            plan.trace, records, 0.0, plan.trace.seconds, plan.slo, plan.settle
        )
    ideal = results["policies"]["oracle"]
    results["gap"] = {
        name: gap(plan.trace, results["policies"][name], ideal) for name in runs if name != "oracle"
    }
    results["timeline"] = {
        name: [(r.start, r.served_by or "") for r in records if r.ok]
        for name, records in runs.items()
    }
    return results


def gap(trace: Trace, mine: dict[str, Any], best: dict[str, Any]) -> dict[str, float | None]:
    """How far a policy is from the oracle: its median TPOT over the oracle's in each phase,
    averaged over the trace's time (above 0: slower), and its output tok/s over the
    oracle's overall (below 0: fewer)."""
    ratios = [
        a["tpot_ms_p50"] / b["tpot_ms_p50"] - 1 if a["tpot_ms_p50"] and b["tpot_ms_p50"] else None
        for a, b in zip(mine["phases"], best["phases"], strict=True)
    ]
    slower = over_time(trace, ratios)
    tps, best_tps = mine["overall"]["output_tps"], best["overall"]["output_tps"]
    return {
        "tpot": None if slower is None else round(slower, 4),
        "output_tps": round(tps / best_tps - 1, 4) if best_tps else None,
    }
