"""``specroute bench convergence``: online calibration from a wrong start, offline in virtual
time. A pair of one model on one GPU group (their steps taking turns), routed by the
crossover with ``--online adopt`` and every other online setting at the router's defaults
(exploration included), started with no profile (a crossover of 0), or with a crossover a
factor of 4 above or below the truth. Traffic climbs past the truth and back (a ramp of
closed-loop clients from a quarter of it to four times it), or follows the Azure LLM
inference trace 2023 (its requests' arrivals and lengths, its rate scaled so that its mean
load is ``AZURE_LOAD`` times the truth).

The truth is what calibrating the pair finds (``--predict``: each server alone at each
level): the bands where speculation pays, one crossover for a dense model, a band for a
mixture of experts; each edge's interval, at best, the two doubling levels around it, where
the live fit measures. A start off by a factor moves every edge by it. Each run says when
the bands routed by came to agree with the truth's for good (the same edges below the
ramp's top, each inside its interval: ``converged_at``), the requests sent by then, the
stretches they did not once a live crossing had been adopted (``outside``), and what
exploring cost: tok/s against the same run without exploration. With ``prompts`` of several
lengths, each is a context bucket with a truth of its own (``contexts``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import cache
from typing import Any

from specroute.bench.learning import Learning
from specroute.bench.replay import ReplayPlan, replay
from specroute.crossing import Band, bands, crossings, first_top
from specroute.emulator.predict import predict
from specroute.loadgen import lag
from specroute.loadgen.dataset import synthetic, synthetic_tokens_per_byte
from specroute.loadgen.record import RequestRecord, mean_latency
from specroute.loadgen.request_trace import RequestTrace
from specroute.loadgen.trace import Phase, Trace
from specroute.model_flags import config_from_flags
from specroute.online.estimator import Online, OnlineMode
from specroute.online.exploration import Exploration
from specroute.online.fit import DEFAULT_LEVELS
from specroute.policies.context_crossover import ContextCrossoverParams, ContextCrossoverPolicy
from specroute.policies.crossover import CrossoverParams, CrossoverPolicy
from specroute.policies.policy import Policy
from specroute.policies.profile import ContextAxis, ContextBucket, Crossover, Profile
from specroute.policies.static import AlwaysPolicy
from specroute.policies.view import LiveBands, Pool
from specroute.router.components import samples, sureness
from specroute.router.settings import RouterSettings

INPUT_LEN, OUTPUT_LEN = 256, 128
PROFILED = [1, 2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128]  # where the truth is predicted
STARTS: dict[str, float | None] = {"none": None, "4x high": 4.0, "4x low": 0.25}
RAMP = (0.25, 0.5, 1, 2, 4, 2, 1, 0.5)  # clients per phase, times the truth
AZURE_LOAD = 1.5  # the Azure trace's mean load, times the truth
PROBES = 5  # the replays that find the Azure trace's rate
# virtual seconds: the longest the bands routed by may stay outside the truth's intervals
# once a live crossing was first adopted (a fit not sure falls back to the start's; one a
# level short is adopted) before they are back inside, for a run to hold (``Converged.held``)
REVERTED_WITHIN = 600.0


@dataclass(frozen=True)
class TruthEdge:
    """Where speculation stops paying going up in load (``down``) or starts (``up``), and
    the doubling levels around it: the live fit's interval, at best."""

    at: float
    direction: str
    interval: tuple[float, float]


@dataclass(frozen=True)
class Truth:
    crossover: float  # the first edge: a dense model's crossover
    interval: tuple[float, float]  # the doubling levels around it: the live fit's, at best
    tpot: float  # the speculative server's seconds per token there, for the Azure rate
    bands: tuple[Band, ...] = ()  # where speculation pays (a mixture of experts: a band)
    edges: tuple[TruthEdge, ...] = ()  # every edge of the bands, in order of load


@dataclass(frozen=True)
class Converged:
    start: str
    traffic: str
    truth: Truth
    started_at: float  # the crossover routed by at the start
    seconds: float  # the run's, virtual
    requests: int
    converged_at: float | None  # from here on every fit routed by one inside the interval
    requests_by: int | None  # the requests sent before it
    outside: list[tuple[float, float, float]]  # once adopted: each stretch out, its edge
    routed_at_end: float  # the first edge of the bands routed by at the end (0: none)
    explored: int
    turns: int
    tps: float
    tps_unexplored: float | None  # the same run without exploration (None: not run)
    latency: float  # a request's mean seconds from sent to its last token
    latency_unexplored: float | None
    bands_at_end: tuple[Band, ...] = ()  # the bands routed by at the end (the first context's)
    # with prompts of several lengths, per context bucket: its KV tokens, its truth and the
    # bands routed by at the end
    contexts: tuple[tuple[float, Truth, tuple[Band, ...]], ...] = ()

    @property
    def held(self) -> bool:
        """Whether it came to route by the truth for good, and every stretch out after the
        first adoption was back within ``REVERTED_WITHIN``."""
        return self.converged_at is not None and self.longest_out <= REVERTED_WITHIN

    @property
    def longest_out(self) -> float:
        """The longest stretch out after the first adoption, in virtual seconds (0: none)."""
        return max((end - begun for begun, end, _ in self.outside), default=0.0)

    @property
    def cost(self) -> float | None:
        """Exploring's cost, the share of tok/s the same run without it had more (on the
        ramp's closed loop; on a trace's open loop every request comes and tok/s is the
        same, and the cost is in ``slower``)."""
        if not self.tps_unexplored:
            return None
        return 1 - self.tps / self.tps_unexplored

    @property
    def slower(self) -> float | None:
        """Exploring's cost in a request's mean time, over the same run without it."""
        if not self.latency_unexplored:
            return None
        return self.latency / self.latency_unexplored - 1


@dataclass(frozen=True)
class Draw:
    """A start on a traffic replayed with the prompts' words drawn from ``seed`` (and with
    them each request's draws in the emulator): when it came in for good, where it ended,
    its longest stretch out and whether it held (``Converged.held``)."""

    start: str
    traffic: str
    seed: int
    converged_at: float | None
    routed_at_end: float
    longest_out: float
    held: bool


def drawn(run: Converged, seed: int) -> Draw:
    """``run``, replayed from ``seed``, as a draw."""
    return Draw(
        run.start,
        run.traffic,
        seed,
        run.converged_at,
        run.routed_at_end,
        run.longest_out,
        run.held,
    )


def defaults(at_prefill: bool | None = None) -> RouterSettings:
    """The router's settings as a user gets them: what every run routes and learns by
    (``at_prefill``: ``online_at_prefill`` set; None: the router's default)."""
    given = {} if at_prefill is None else {"online_at_prefill": at_prefill}
    return RouterSettings.model_validate(
        {"spec": ["http://spec:1"], "base": ["http://base:2"], "online": "adopt", **given}
    )


@cache
def truth(model: tuple[str, ...], input_len: int = INPUT_LEN) -> Truth:
    """What calibrating the pair on one GPU group finds (once per model and prompt length:
    every run and the Azure rate's probes ask): each server alone at each level, and every
    edge of the bands where speculation pays."""
    spec = config_from_flags((*model, "--share-gpus", "group"), "spec")
    base = replace(spec, mode="base")
    found = predict(spec, PROFILED, input_len, OUTPUT_LEN, base=base)
    levels = [float(lv.concurrency) for lv in found.levels]
    margin = [math.log(speedup) for _, speedup in found.per_request]
    turns = crossings(levels, margin)
    if not turns:
        raise ValueError("speculation pays at every level up to 128 or at none: no crossover")
    edges = tuple(TruthEdge(t.at, t.direction, _around(t.at)) for t in turns)
    first = edges[0]
    near = min(found.levels, key=lambda lv: abs(lv.concurrency - first.at))
    paying = tuple(bands(levels, margin))
    return Truth(first.at, first.interval, 1 / near.spec.per_request, paying, edges)


def _around(at: float) -> tuple[float, float]:
    """The doubling levels around ``at``: where the live fit measures."""
    return max(x for x in DEFAULT_LEVELS if x <= at), min(x for x in DEFAULT_LEVELS if x >= at)


def converge(
    model: tuple[str, ...],
    start: str,
    traffic: RequestTrace | int,
    seed: int = 0,
    progress: Callable[[str], None] = lambda _: None,
    priced: bool = True,
    prompts: tuple[int, ...] = (),
    at_prefill: bool | None = None,
) -> Converged:
    """One run from ``start`` (a name of ``STARTS``) on ``traffic``: the ramp this many
    times over (60 s a phase), or a request trace (the Azure window, as it comes: scale it
    with ``azure_at``); and, ``priced``, the same run without exploration, for its cost.
    ``prompts``: prompt lengths (two or more, a ramp only) to run as context buckets: each
    ramp step's minute split among them, routed by ``context-crossover`` from a ``v2``
    profile whose buckets each start off by the factor, each adopted on its own.
    ``at_prefill``: the router's ``online_at_prefill`` (None: its default)."""
    truths = tuple(truth(model, n) for n in prompts) if prompts else (truth(model),)
    known, factor = truths[0], STARTS[start]
    if prompts and factor is None:
        raise ValueError("without a profile there are no context buckets: start off by a factor")
    begin = 0.0 if factor is None else known.crossover * factor
    starts = tuple(() if factor is None else scaled(t.bands, factor) for t in truths)
    plan = replay_plan(model, known, traffic, seed, prompts)
    settings = defaults(at_prefill)
    runs: dict[float, tuple[list[RequestRecord], Learning, Exploration | None]] = {}
    for share in (
        (settings.online.explore_share, 0.0) if priced else (settings.online.explore_share,)
    ):
        name = "ramp" if isinstance(traffic, int) else traffic.name
        progress(f"from {start}, {name}: exploring {share:g}")
        online = Online(
            OnlineMode.ADOPT,
            samples(settings.online),
            sureness(settings.online),
            per_level=settings.online.window_samples,
            accept_tolerance=settings.online.accept_tolerance,
            at_prefill=settings.online.at_prefill,
        )
        explores = Exploration(online, share, settings.online.explore_span) if share > 0 else None
        profile = _buckets(prompts, starts) if prompts else None
        learning = Learning(
            online, profile, settings.online.interval, exploration=explores, routed=starts
        )
        policy: Policy = CrossoverPolicy(CrossoverParams(), first_top(starts[0]), starts[0])
        if profile is not None and profile.context is not None:
            policy = ContextCrossoverPolicy(ContextCrossoverParams(), profile.context)
        runs[share] = (replay(plan, policy, f"{start} {share:g}", learning), learning, explores)
    records, learning, explores = runs[settings.online.explore_share]
    assert explores is not None
    routed = [(t, _routed(starts, live)) for t, live in learning.bands]
    adopted = next((t for t, live in learning.bands if any(b is not None for b in live)), None)
    at, outside = settled(routed, truths, adopted)
    end = routed[-1][1] if routed else starts
    return Converged(
        start,
        traffic_name(traffic),
        known,
        begin,
        plan.trace.seconds,
        len(records),
        at,
        None if at is None else sum(1 for r in records if r.start < at),
        outside,
        first_edge(end[0]),
        sum(explores.explored.values()),
        sum(explores.turns.values()),
        output_tps(records, plan.trace.seconds),
        output_tps(runs[0.0][0], plan.trace.seconds) if priced else None,
        mean_latency(records),
        mean_latency(runs[0.0][0]) if priced else None,
        end[0],
        tuple(
            (n + OUTPUT_LEN / 2, t, bands) for n, t, bands in zip(prompts, truths, end, strict=True)
        )
        if prompts
        else (),
    )


def _buckets(prompts: tuple[int, ...], starts: tuple[tuple[Band, ...], ...]) -> Profile:
    """A ``v2`` profile of bands only, a bucket per prompt length (its mean KV tokens while
    decoding), for the synthetic prompts' tokens per byte: the start a context run routes
    by, its buckets the fits' (no curves: a profile off by a factor is off in them too)."""
    ratio = synthetic_tokens_per_byte(list(prompts), OUTPUT_LEN)
    buckets = tuple(
        ContextBucket(n + OUTPUT_LEN / 2, Crossover(None, None, "below", None, bands))
        for n, bands in zip(prompts, starts, strict=True)
    )
    return Profile(buckets[0].crossover, context=ContextAxis(ratio, buckets))


def _routed(starts: tuple[tuple[Band, ...], ...], live: LiveBands) -> tuple[tuple[Band, ...], ...]:
    """Per context, the bands routed by: the live ones where adopted, else the start's."""
    if len(live) != len(starts):
        return starts
    return tuple(s if b is None else b for s, b in zip(starts, live, strict=True))


def scaled(paying: tuple[Band, ...], factor: float) -> tuple[Band, ...]:
    """Bands with every edge moved by ``factor``: a profile that factor off."""
    return tuple(
        (None if a is None else a * factor, None if b is None else b * factor) for a, b in paying
    )


def _edges(paying: tuple[Band, ...]) -> list[tuple[float, str]]:
    """The edges of bands in order of load: each start ``up``, each closed top ``down``."""
    found = []
    for start, end in paying:
        found += [(start, "up")] if start is not None else []
        found += [(end, "down")] if end is not None else []
    return found


def first_edge(paying: tuple[Band, ...]) -> float:
    """The first edge of bands (0: speculation nowhere, or everywhere)."""
    edges = _edges(paying)
    return edges[0][0] if edges else 0.0


def _agrees(paying: tuple[Band, ...], known: Truth) -> bool:
    """Whether bands route as the truth's do at the loads the traffic brings (below four
    times its first edge, the ramp's top): the same edges, each inside its edge's
    interval."""
    top = known.crossover * max(RAMP)  # past the load the traffic brings, an edge is moot
    mine = [(at, way) for at, way in _edges(paying) if at < top]
    want = [e for e in known.edges if e.at < top]
    return len(mine) == len(want) and all(
        way == e.direction and e.interval[0] <= at <= e.interval[1]
        for (at, way), e in zip(mine, want, strict=True)
    )


def azure_at(
    window: RequestTrace, model: tuple[str, ...], load: float = AZURE_LOAD
) -> RequestTrace:
    """``window`` at the rate whose mean load is ``load`` times the truth: its first five
    minutes served by the plain server alone, the rate moved by the square root of the
    target over the mean load found (Little's law: requests' seconds over the span), from
    the rate the truth's TPOT alone would give, ``PROBES`` times."""
    known = truth(model)
    target = load * known.crossover
    mean = sum(r.output_tokens for r in window.requests) / len(window.requests)
    rate = target / (mean * known.tpot)
    for _ in range(PROBES):
        trial = window.scaled(rate / window.rate)
        trial = trial.window(0.0, min(trial.seconds, 300.0))
        served = replay(replay_plan(model, known, trial, 0), AlwaysPolicy("base"))
        busy = sum((r.end or trial.seconds) - r.start for r in served)
        found = busy / trial.seconds if trial.seconds > 0 else target
        rate *= math.sqrt(target / max(found, 1e-9))
    return window.scaled(rate / window.rate)


@dataclass(frozen=True)
class Fixed:
    """One crossover routed by throughout, no online calibration: what it gives on a traffic
    (0: never speculating). Where the truth is the best of these, converging to it pays."""

    traffic: str
    crossover: float
    tps: float
    latency: float  # a request's mean time, seconds


def fixed(
    model: tuple[str, ...], traffic: RequestTrace | int, crossovers: Sequence[float]
) -> list[Fixed]:
    """Each crossover of ``crossovers`` routed by on ``traffic``, as ``converge`` runs it."""
    plan = replay_plan(model, truth(model), traffic, 0)
    name, seconds = traffic_name(traffic), plan.trace.seconds
    found = []
    for at in crossovers:
        policy = CrossoverPolicy(CrossoverParams(), at, ((None, at),) if at > 0 else ())
        records = replay(plan, policy, f"fixed {at:g}")
        found.append(Fixed(name, at, output_tps(records, seconds), mean_latency(records)))
    return found


def traffic_name(traffic: RequestTrace | int) -> str:
    """``ramp`` for the ramp's cycles, ``azure`` for a request trace (the Azure window)."""
    return "ramp" if isinstance(traffic, int) else "azure"


def document(
    model: tuple[str, ...],
    runs: list[Converged],
    live: Sequence[tuple[Converged, lag.Kept]] = (),
    routed: Sequence[Fixed] = (),
    at_prefill: bool | None = None,
    draws: Sequence[Draw] = (),
) -> dict[str, Any]:
    """The JSON of the runs, of those run live with how far their servers lagged, of the
    fixed crossovers routed by (``routed``) and of the runs replayed from other seeds
    (``draws``); ``at_prefill``: the runs' ``online_at_prefill`` (None: the router's default)."""
    settings = defaults(at_prefill)
    return {
        "model": list(model),
        "defaults": {
            "online_min_samples": settings.online.min_samples,
            "online_max_ratio": settings.online.max_ratio,
            "online_window_samples": settings.online.window_samples,
            "online_window_seconds": settings.online.window_seconds,
            "online_explore_share": settings.online.explore_share,
            "online_explore_span": settings.online.explore_span,
            "online_at_prefill": settings.online.at_prefill,
        },
        "runs": [asdict(r) | {"cost": r.cost, "slower": r.slower} for r in runs],
        "live": [asdict(r) | {"lag": k.lag, "elsewhere": k.elsewhere} for r, k in live],
        "fixed": [asdict(f) for f in routed],
        "reverted_within": REVERTED_WITHIN,
        "draws": [asdict(d) for d in draws],
    }


def render(document: dict[str, Any]) -> str:
    """A row per run: the truth (its first edge, ``up`` where speculation starts paying),
    when the bands routed by came to agree with it for good and the requests by then, the
    first edge routed by at the end, the stretches out after the first adoption (the
    longest), the requests explored, and exploring's cost in tok/s and in a request's mean
    time; under a row, the bands routed by at the end where the truth is bands, and each
    context bucket's; then the fixed crossovers, if any, and how often each start held over
    its draws."""
    live = [r | {"traffic": f"{r['traffic']} live"} for r in document.get("live", [])]
    rows = [*document["runs"], *live]
    header = (
        "start    traffic    truth [interval]  in for good at  requests by       at end  "
        "out after adopting  explored (turns)  tok/s   time"
    )
    lines = [header] if rows else []
    for r in rows:
        t, at, out = r["truth"], r["converged_at"], r["outside"]
        settled = "never" if at is None else f"{at:,.0f} s"
        by = "-" if r["requests_by"] is None else f"{r['requests_by']:,} of {r['requests']:,}"
        longest = max((end - start for start, end, _ in out), default=0.0)
        strays = f"{len(out)}, longest {longest:.0f} s" if out else "none"
        up = " up" if [e["direction"] for e in t.get("edges", [])][:1] == ["up"] else ""
        lines.append(
            f"{r['start']:<8} {r['traffic']:<10} {t['crossover']:5.1f}{up} "
            f"[{t['interval'][0]:g}, {t['interval'][1]:g}]  {settled:<15} {by:<17} "
            f"{r['routed_at_end']:6.1f}  {strays:<18}  {r['explored']:>5} ({r['turns']}){'':<7} "
            f"{_signed(r.get('cost'))}  {_signed(r.get('slower'))}"
        )
        given = t.get("bands")  # absent from a run before bands were measured
        banded = given is not None and (len(given) != 1 or given[0][0] is not None)
        for context, truth_there, bands_there in r.get("contexts", []):
            lines.append(
                f"    context {context:g}: truth {_bands(truth_there['bands'])}, "
                f"at end {_bands(bands_there)}"
            )
        if "lag" in r:
            kept = lag.Kept(r["lag"], r.get("elsewhere"))  # absent from runs before it was read
            lines.append(
                f"    live: the servers' lag {lag.shown(kept.lag)}, a request's time "
                f"elsewhere {'-' if kept.elsewhere is None else f'{kept.elsewhere:.1%}'}"
                + ("" if kept.kept else f" NOT KEPT TIME ({kept.said()})")
            )
        if banded and not r.get("contexts"):
            lines.append(f"    truth {_bands(given)}, at end {_bands(r.get('bands_at_end', []))}")
    within = document.get("reverted_within", REVERTED_WITHIN)
    over_draws = _draws(document.get("draws", []), within)
    return "\n".join([*lines, *_fixed(document.get("fixed", [])), *over_draws])


def _draws(rows: list[dict[str, Any]], within: float) -> list[str]:
    """A line per start and traffic: how many of its draws held, the longest stretch out of
    those that did, and how the others went (never in, or their longest stretch out), the
    seeds that went alike together."""
    lines: list[str] = []
    for start, traffic in dict.fromkeys((r["start"], r["traffic"]) for r in rows):
        mine = [r for r in rows if (r["start"], r["traffic"]) == (start, traffic)]
        held = [r for r in mine if r["held"]]
        missed: dict[str, list[str]] = {}  # each way a draw missed: the seeds that did
        for r in mine:
            if not r["held"]:
                way = (
                    f"never in, ends at {r['routed_at_end']:.1f}"
                    if r["converged_at"] is None
                    else f"{r['longest_out']:.0f} s out"
                )
                missed.setdefault(way, []).append(str(r["seed"]))
        said = [
            f"seed{'s' if len(seeds) > 1 else ''} {', '.join(seeds)}: {way}"
            for way, seeds in missed.items()
        ]
        longest = max(held, key=lambda r: r["longest_out"], default=None)
        if longest is not None and longest["longest_out"] > 0:
            said.insert(0, f"longest out {longest['longest_out']:.0f} s, seed {longest['seed']}")
        shown = f" ({'; '.join(said)})" if said else ""
        lines.append(f"  from {start}, {traffic}: held {len(held)} of {len(mine)}{shown}")
    heading = f"draws (held: in for good, every stretch out back within {within:g} s):"
    return [heading, *lines] if lines else []


def _fixed(rows: list[dict[str, Any]]) -> list[str]:
    """The fixed crossovers, a line per traffic: each one's tok/s and mean time against
    never speculating's (the crossover 0) on that traffic."""
    lines: list[str] = []
    for traffic in dict.fromkeys(r["traffic"] for r in rows):
        mine = [r for r in rows if r["traffic"] == traffic]
        never = next((r for r in mine if r["crossover"] == 0), None)
        shown = []
        for r in mine:
            against = ""
            if never is not None and r is not never and never["tps"] > 0 and never["latency"] > 0:
                tps = r["tps"] / never["tps"] - 1
                against = f" ({_signed(tps)}, {_signed(r['latency'] / never['latency'] - 1)})"
            shown.append(f"{r['crossover']:g}: {r['tps']:,.0f}, {r['latency']:.2f} s{against}")
        lines.append(f"  {traffic}: " + "; ".join(shown))
    heading = "fixed crossovers, no online calibration (tok/s, mean time; 0: never):"
    return [heading, *lines] if lines else []


def _bands(bands: Any) -> str:
    """Bands in words: ``[a, b]`` each, open ends as ``-`` (none: ``nowhere``)."""
    if not bands:
        return "nowhere"
    return " ".join(
        f"[{'-' if a is None else f'{a:.1f}'}, {'-' if b is None else f'{b:.1f}'}]"
        for a, b in bands
    )


def _signed(share: float | None) -> str:
    return "-" if share is None else f"{100 * share:+.1f}%"


def replay_plan(
    model: tuple[str, ...],
    known: Truth,
    traffic: RequestTrace | int,
    seed: int,
    prompts: tuple[int, ...] = (),
) -> ReplayPlan:
    """The replay: the ramp's clients from a quarter of the first edge to four times it,
    60 s a step (with ``prompts``, the step's minute split among them, its clients from a
    quarter of the buckets' edges' geometric mean to four times it); or the request trace."""
    spec = config_from_flags((*model, "--share-gpus", "group", "--noise", "default"), "spec")
    servers: dict[Pool, Any] = {"spec": spec, "base": replace(spec, mode="base")}
    backends: dict[Pool, tuple[str, ...]] = {"spec": ("http://spec:1",), "base": ("http://base:2",)}
    dataset = synthetic(INPUT_LEN, OUTPUT_LEN, seed=seed)
    if isinstance(traffic, int):
        edges = [truth(model, n).crossover for n in prompts] or [known.crossover]
        middle = math.exp(sum(math.log(x) for x in edges) / len(edges))
        clients = [max(1, round(middle * f)) for f in RAMP]
        lengths: list[tuple[int, ...]] = [(n,) for n in prompts] or [()]
        seconds = 60.0 / len(lengths)
        steps = tuple(Phase(seconds, c, input_len=n) for c in clients for n in lengths)
        trace = Trace("ramp", steps * traffic)
        return ReplayPlan(trace, dataset, servers, backends, output_len=OUTPUT_LEN, seed=seed)
    whole = Trace(traffic.name, (Phase(traffic.seconds),))
    return ReplayPlan(
        whole, dataset, servers, backends, output_len=OUTPUT_LEN, seed=seed, requests=traffic
    )


def settled(
    routed: list[tuple[float, tuple[tuple[Band, ...], ...]]],
    truths: tuple[Truth, ...],
    first: float | None,
) -> tuple[float | None, list[tuple[float, float, float]]]:
    """When the bands routed by (per context) came to agree with the truths for good
    (``_agrees``), and the stretches they did not once a live crossing had first been
    adopted (at ``first``; None: never): start, end, the first context's first edge at
    start."""

    def agree(paying: tuple[tuple[Band, ...], ...]) -> bool:
        return all(_agrees(b, t) for b, t in zip(paying, truths, strict=True))

    at: float | None = None
    for t, paying in routed:
        at = (at if at is not None else t) if agree(paying) else None
    outside: list[tuple[float, float, float]] = []
    begun: tuple[float, float] | None = None
    for t, paying in routed:
        if first is None or t < first:
            continue
        out = not agree(paying)
        if out and begun is None:
            begun = (t, first_edge(paying[0]))
        elif not out and begun is not None:
            outside.append((begun[0], t, begun[1]))
            begun = None
    if begun is not None:
        outside.append((begun[0], routed[-1][0], begun[1]))
    return at, outside


def output_tps(records: list[RequestRecord], seconds: float) -> float:
    tokens = sum(r.output_tokens or 0 for r in records if r.end is not None and r.error is None)
    return tokens / seconds if seconds > 0 else 0.0
