"""Online calibration: the live curves fitted from served requests, drift from the profile,
and, in ``adopt``, the live crossing routed by once it is sure: a crossover, or bands where
the margin turns more than once (a mixture-of-experts model), per context bucket of the
profile (one without a context axis), each bucket's adopted or not on its own evidence.

On the request path only cheap steps: the load a request joins, read at dispatch, the load
lived through so far (the board's integral of in-flight counts over time) at its first
byte and at its end, and one sample appended then (``served``). The fit runs in a background
task every ``online_interval`` seconds (``keep_fitting``), off the request path.

Which requests make samples: those answered 200 as a stream whose last event says how many
tokens they produced (``stream_options.include_usage``, which the router asks of the server
for every stream it forwards); a whole body has no first token to time the decode from. A
sample's load is the mean load the request decoded under, from its first byte to its end, as
a profile's level is the load its requests decoded under: the load it joined is not, since
under a crossover a server's load rises and falls between the crossover and below it, so
that a request joining at the bottom decodes among more (and one joining at the top among
fewer). Load is counted as the policy counts it: the server's own requests in flight in the
partitioned topology, its GPU group's (both pools) in the shared one, itself included; the
load it joined is the sample's when it had no time decoding.

Several workers learn as one: each records its samples, at loads counted over every worker
through the board, in a ring of its own in shared memory (``Rings``: a slot, no lock). The
leader (worker 0) alone fits, from what every ring was given since its last fit, taken into
its ``Samples`` so that the window forgets by count and by age as one worker's would; it
publishes what it routes by on the board (one crossover itself; bands, or crossings per
context, as a pointer to the fit), read by every worker before its next decision, and the
fit as a file in the workers' folder (``router.online.published``), which every worker's status
page and gauges show. No worker routes on an estimate another lacks.

Under a concurrency source other than ``router`` (several router replicas in front of the
same servers: ``replicas``; or ``backend``, ``max``), the policy counts a server's load as
its report brought up to date with this router's own requests, so a sample's load is the
own requests' mean plus the other routers' requests averaged over the same time: the
backend's reported running and queued less this router's own at each reading of the
leader's, held from one reading to the next while it is believed (the board integrates
it beside the readings). Between two readings the others' part is a step, not the truth,
as it is for the policy.

Each speculative sample carries its server's live accept length at its end. At each fit,
with the pool's accept length now known (its healthy servers' readings within the window),
the speculative samples whose own differs from it by more than ``accept_tolerance``
(relative) are left out of the fit, as taught by another drafter: after a drop in
acceptance, the samples from before it would otherwise hold each level's median until as
many new ones displace them. They stay in the window, and count again when acceptance comes
back; a sample without an accept length (the plain pool's, or one before any reading)
counts always.

Several replicas learn as one too (``router.online.peers``): each serves the samples its workers
recorded (its rings, never what it took from peers) at ``GET /router/online/samples``, and
each leader takes every peer's new ones before each fit (``online_peers.Peers``), passed
to ``refit`` with the rings' own, so that every replica fits from every replica's samples.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any, NamedTuple, Protocol

from specroute.crossing import CONFIDENCE, ONE_SIDED, Band, first_top
from specroute.online.fit import (
    DEFAULT_LEVELS,
    Known,
    Live,
    LiveCrossing,
    LiveFit,
    Shape,
    fit,
    nearest,
)
from specroute.online.samples import (
    BESIDE_LIMIT,
    Reading,
    Sample,
    Samples,
    beside_other,
    taught_elsewhere,
)
from specroute.policies.curves import Curves, context_curves, curves
from specroute.policies.profile import Crossover, Profile, ProfileError, up_to
from specroute.policies.view import ConcurrencySource, LiveBands, Pool

_log = logging.getLogger("specroute.router")


KEPT_PER_LEVEL = 128  # the buffer holds this many times the samples a level counts
# and a row of it (a pool at a load and a context, each to a doubling) twice: a level's, and
# as many again taught by another drafter, kept for when acceptance comes back
ROW_PER_LEVEL = 2
# a speculative sample whose accept length is further than this from the pool's now, relative,
# was taught by another drafter: wider than a reading's noise (a polling window of counters at
# 2 requests reads 2.6 to 3.4 at an accept length of 3.0 and 1.4 to 1.8 at 1.6 in the offline
# replay, 1 in 100 same-drafter samples further than this; SGLang's 40-step gauge, 2.83 to
# 3.03), narrower than a drift that moves the crossover (3.0 to 1.6: none kept)
ACCEPT_TOLERANCE = 0.25


class OnlineMode(StrEnum):
    OFF = "off"
    OBSERVE = "observe"
    ADOPT = "adopt"


@dataclass(frozen=True)
class Sureness:
    """When a live crossover is sure enough to route by: at least ``min_samples`` live
    samples at each level around it in each pool (both pools measured live there: never past
    the evidence, a pool that stood on the profile's value counts none), and a closed interval
    at most ``max_ratio`` wide (high / low; 2 by default: one doubling of load, so that the
    replicates agree on the two doubling levels it lies between, and its point is not one
    draw from a span of several); for a bound (speculation pays at no level, or at every
    one), as many samples of each pool at its level and 97.5% of the replicates finding it.

    Once adopted, a crossover is kept where it is while the evidence holds it half as well
    (half the samples, twice the ratio, a bound's replicates missing it twice as often, and
    its interval still holding it): hysteresis, so
    that routing does not flap between the live and the profiled crossover, nor follow a
    point that wanders inside a wide interval. Only a sure fit moves it."""

    min_samples: int = 16
    max_ratio: float = 2.0

    def sure(self, found: LiveCrossing | None, holding: bool) -> bool:
        """Bands (``found.edges``) are as sure as their least sure edge, each by the rule
        of a crossover, and a band that ends at the last level as a bound is."""
        if found is None:
            return False
        need = self.min_samples / 2 if holding else self.min_samples
        if found.near < need:
            return False
        ratio = self.max_ratio * 2 if holding else self.max_ratio
        # of the replicates, the share that must agree: 97.5%, one side of the 95% interval;
        # while held, a miss twice as often (95%)
        agree = CONFIDENCE if holding else ONE_SIDED
        if found.edges:
            return found.beyond >= agree and all(
                e.low is not None and e.high is not None and e.high <= e.low * ratio
                for e in found.edges
            )
        if found.at is None:
            return found.beyond >= agree
        if found.low is None or found.high is None:
            return False
        return found.high <= found.low * ratio

    def holds(self, found: LiveCrossing | None, adopted: LiveCrossing) -> bool:
        """Whether a fit still holds the crossing adopted: sure half as well, and its
        interval (a bound's, from its limit outwards) around the crossover adopted; for
        bands, the same turns, each interval around the edge adopted."""
        if not self.sure(found, holding=True):
            return False
        assert found is not None
        if adopted.edges or found.edges:
            turns = [e.direction for e in found.edges]
            return turns == [e.direction for e in adopted.edges] and all(
                (new.low is None or new.low <= was.at) and (new.high is None or was.at <= new.high)
                for new, was in zip(found.edges, adopted.edges, strict=True)
            )
        low, high = _span(found.low, found.high, found.at, found.bound, found.limit)
        threshold = adopted.threshold
        return threshold is not None and low <= threshold <= high


# the load a request lived through up to a moment (``samples.Reading``)
Lived = Callable[[float], Reading]


class SharedSamples(Protocol):
    """Where each worker records its own samples, and the leader takes the others' from
    (the router's rings in shared memory)."""

    @property
    def workers(self) -> int: ...

    def add(self, sample: Sample) -> None: ...

    def fresh(self) -> list[Sample]: ...


class ServerLoad(Protocol):
    """Where a request runs, as far as the load it joins goes: a backend."""

    @property
    def inflight(self) -> int: ...

    @property
    def group(self) -> str: ...

    @property
    def pool(self) -> Pool: ...

    def lived(self, now: float) -> float: ...

    def others(self, now: float) -> float: ...

    def others_lived(self, now: float) -> float: ...

    def prompted(self) -> float: ...


@dataclass(frozen=True)
class FitJob:
    """One fit's inputs, taken on the event loop (``Online.prepare``); ``run`` makes its
    fits from them alone (the window is a copy), so that it may run in a thread of its
    own; ``Online.settle`` puts what it made in force."""

    now: float
    window: list[Sample]
    profile: Profile | None
    accept_length: float | None
    tolerance: float
    min_samples: int
    per_level: int | None
    made_from: tuple[object, ...]
    shared: bool = True
    # per context bucket, the pools' levels live in the last fit: they stay in this one down
    # to half ``min_samples`` (hysteresis: a level enters at the full count)
    stay: tuple[Live, ...] = ()
    # per context bucket, whether the routing in force has bands (``banded``; None: it
    # speculates nowhere, no profile's prior)
    banded: tuple[bool | None, ...] = ()
    depth: float | None = None  # the draft depth ``accept_length`` was read at (None: unknown)
    at_prefill: bool = False  # each sample read at its level's prefill (``fit``)

    def run(self) -> Made:
        """The fits, per context bucket of the profile (one when it has none), and how
        many samples of the window were left out: taught by another drafter, and taken
        beside the other pool's requests on the same GPUs."""
        accept, tolerance, depth = self.accept_length, self.tolerance, self.depth
        drafted = [s for s in self.window if not taught_elsewhere(s, accept, tolerance, depth)]
        counted = [s for s in drafted if not (self.shared and beside_other(s))]
        profile = self.profile
        axis = None if profile is None else profile.context
        parts: list[tuple[float | None, list[Sample], Known | None, Shape | None]]
        if profile is None or axis is None:
            parts = [(None, counted, _known(profile), _shape(profile))]
        else:
            contexts = [b.context for b in axis.buckets]
            split: list[list[Sample]] = [[] for _ in contexts]
            for s in counted:
                split[nearest(contexts, s.context)].append(s)
            parts = [
                (c, part, _at_context(profile, c), _shape_at_context(profile, c))
                for part, c in zip(split, contexts, strict=True)
            ]
        levels, least, per = _levels(profile), self.min_samples, self.per_level
        stays = self.stay if len(self.stay) == len(parts) else (frozenset(),) * len(parts)
        kinds = self.banded if len(self.banded) == len(parts) else (False,) * len(parts)
        fits = tuple(
            fit(
                part,
                levels,
                c,
                known,
                least,
                per,
                shape=shape,
                stay=stay,
                banded=kind,
                at_prefill=self.at_prefill,
            )
            for (c, part, known, shape), stay, kind in zip(parts, stays, kinds, strict=True)
        )
        return Made(fits, len(self.window) - len(drafted), len(drafted) - len(counted))


class Made(NamedTuple):
    """What a fit made: its fits, and the samples of the window it left out, by reason."""

    fits: tuple[LiveFit, ...]
    other_drafter: int  # taught by another drafter than the one serving now
    beside_other_pool: int  # taken beside the other pool's requests on the same GPUs


class Online:
    def __init__(
        self,
        mode: OnlineMode,
        samples: Samples,
        sureness: Sureness,
        per_level: int | None = None,
        rings: SharedSamples | None = None,
        leads: bool = True,
        source: ConcurrencySource = ConcurrencySource.ROUTER,
        accept_tolerance: float = ACCEPT_TOLERANCE,
        at_prefill: bool = False,
    ) -> None:
        """``per_level``: the last samples of each pool and level that count (all: None);
        ``rings``: where each worker records its own samples, for the leader with several,
        and for the peer replicas that ask (``GET /router/online/samples``); ``leads``:
        whether this worker fits (alone, or the leader of several); ``source``: how the
        policy counts load, and so the samples (every source but ``router`` counts the
        other routers' requests too); ``accept_tolerance``: how far, relative, a speculative
        sample's accept length may be from the pool's at a fit and still count (0: any);
        ``at_prefill``: the fit reads each sample at its level's prefill, and a dense margin
        that turns more than once as its one fall (``online.fit``)."""
        self.mode, self.samples, self.sureness = mode, samples, sureness
        self.per_level, self.rings = per_level, rings
        self.alone = rings is None or rings.workers == 1  # its samples are its Samples' at once
        self.counts_others = source is not ConcurrencySource.ROUTER
        self.records = mode is not OnlineMode.OFF
        self.fitting = leads and self.records
        self.shared = True  # the topology the load joined is counted in, from the policy
        self.fits: tuple[LiveFit, ...] = ()
        self.drift: tuple[bool, ...] = ()
        # in adopt, per fit (context bucket): the live bands routed by, None where the
        # profile's stand; () when none is
        self.live_bands: LiveBands = ()
        self._held: tuple[LiveCrossing | None, ...] = ()  # the leader's: the crossings adopted
        self.fitted_at: float | None = None
        self._fitted_on: tuple[object, ...] | None = None  # what the last fit was made from
        self.counted = 0  # in a worker that does not fit: the samples of the leader's fit
        self.accept_tolerance = accept_tolerance
        self.at_prefill = at_prefill
        self.accept_length: float | None = None  # the speculative pool's at the last fit
        self.left_out = 0  # the samples the last fit left out, taught by another drafter
        self.beside = 0  # and those it left out, taken beside the other pool's on its GPUs
        self.peers: list[dict[str, Any]] = []  # each peer replica's, as the leader last saw it

    @property
    def adopted(self) -> float | None:
        """The live crossover routed by (the first band's top), for one context; None when
        the profile's is, or the fits are per context (``live_bands`` says each)."""
        if len(self.live_bands) != 1 or (only := self.live_bands[0]) is None:
            return None
        return first_top(only)

    @adopted.setter
    def adopted(self, crossover: float | None) -> None:
        self.live_bands = () if crossover is None else (up_to(crossover),)
        self._held = ()

    # On the request path

    def joined(self, backends: Sequence[ServerLoad], backend: ServerLoad) -> int:
        """The load a request dispatched to ``backend`` now joins, itself included."""
        if not self.records:
            return 0
        seats = [backend] if not self.shared else [b for b in backends if b.group == backend.group]
        own = sum([b.inflight for b in seats]) + 1
        if not self.counts_others:
            return own
        now = time.monotonic()
        return own + round(sum([b.others(now) for b in seats]))

    def lived(self, backends: Sequence[ServerLoad], backend: ServerLoad) -> Lived | None:
        """The load a request at ``backend`` counts, integrated over time up to a moment,
        as its own pool's part and the other pool's beside it on the same GPUs (0 apart),
        and the prompt tokens this router sent to those GPUs so far (the other routers'
        are not known); None: not recording."""
        if not self.records:
            return None
        if not self.shared:
            return _apart(backend, self.counts_others)
        group = [b for b in backends if b.group == backend.group]
        own = [b for b in group if b.pool == backend.pool]
        other = [b for b in group if b.pool != backend.pool]
        if self.counts_others:
            return lambda now: (
                sum([b.lived(now) + b.others_lived(now) for b in own]),
                sum([b.lived(now) + b.others_lived(now) for b in other]),
                sum([b.prompted() for b in group]),
            )
        return lambda now: (
            sum([b.lived(now) for b in own]),
            sum([b.lived(now) for b in other]),
            sum([b.prompted() for b in group]),
        )

    def record(self, sample: Sample) -> None:
        """One served request's sample (``router.online.served`` makes it from a request;
        an offline replay, from its own)."""
        if not self.records:
            return
        if self.rings is not None:
            self.rings.add(sample)  # for the peers; with several workers, for the leader too
        if self.alone:
            self.samples.add(sample)  # else the leader takes it in at its next fit

    def kept(self) -> int:
        """The samples kept: this worker's when it fits; in another worker, those the
        leader's last fit was made from (as it published them)."""
        return len(self.samples) if self.fitting else self.counted

    def describe(self, now: float) -> dict[str, Any]:
        """For ``/router/status``: the mode, the samples kept, and each context's live
        crossover with its interval, its drift and its curves."""
        return {
            "mode": str(self.mode),
            "recording": self.records,
            "samples": self.kept(),
            "fitted_seconds_ago": None if self.fitted_at is None else now - self.fitted_at,
            "adopted_crossover": self.adopted,
            # the speculative pool's accept length the last fit stands at, and the samples
            # it left out as taught by another drafter (further than the tolerance from it)
            "drafter": {
                "accept_length": self.accept_length,
                "tolerance": self.accept_tolerance,
                "samples_left_out": self.left_out,
            },
            # whether the fit reads each sample at its level's prefill (online_at_prefill)
            "at_prefill": self.at_prefill,
            # the samples the last fit left out, taken beside the other pool's requests on
            # the same GPUs (shared topology): not what a level of either pool alone means
            "shared_gpus": {
                "shared": self.shared,
                "beside_limit": BESIDE_LIMIT,
                "samples_left_out": self.beside,
            },
            "peers": [shown(peer, now) for peer in self.peers],
            "fits": [
                {
                    "context": f.context,
                    "samples": f.samples,
                    # the seconds a token decoded waits per prompt token prefilled beside it,
                    # as the fit finds it (each sample read at its level's prefill along it
                    # with at_prefill, as measured without)
                    "prefill_slope": f.prefill_slope,
                    "crossover": None if f.crossing is None else asdict(f.crossing),
                    # the live bands routed by in this context (None: the profile's)
                    "adopted_bands": None if bands is None else [list(b) for b in bands],
                    "drift": drift,
                    "levels": {
                        pool: [asdict(level) for level in rows if level.samples]
                        for pool, rows in f.curves.items()
                    },
                }
                for f, drift, bands in zip(self.fits, self.drift, self._routed(), strict=True)
            ],
        }

    def _routed(self) -> LiveBands:
        """Per fit, the live bands routed by (None: the profile's)."""
        if len(self.live_bands) == len(self.fits):
            return self.live_bands
        return (None,) * len(self.fits)

    # Off it

    def refit(
        self,
        now: float,
        profile: Profile | None,
        shared: bool,
        taken: Sequence[Sample] = (),
        accept_length: float | None = None,
        routed: Sequence[tuple[Band, ...]] | None = None,
        depth: float | None = None,
    ) -> None:
        """The live curves again from the samples in the window, per context bucket of the
        profile (one when it has none), their drift from it and, in ``adopt``, the crossover
        routed by; ``taken``: the peer replicas' samples since the last fit;
        ``accept_length``: the speculative pool's now (None: unknown, every sample counts),
        read at draft depth ``depth``, the samples taught by another drafter left out. All
        here, at once: the router's task does the same in its three steps, the heavy ones off
        the event loop (``online_task.fit_now``); ``routed``: as ``prepare`` takes it."""
        fresh = [*taken, *self.fresh()]
        job = self.prepare(now, profile, shared, fresh, accept_length, routed, depth)
        if job is not None:
            self.settle(job, job.run())

    def fresh(self) -> list[Sample]:
        """The other workers' samples since the last call (the leader of several; alone,
        its own are in its buffer already). Safe beside the request path in a thread of
        its own: each ring has one writer, and its count moves after the slot."""
        return self.rings.fresh() if self.rings is not None and not self.alone else []

    def prepare(
        self,
        now: float,
        profile: Profile | None,
        shared: bool,
        fresh: Sequence[Sample],
        accept_length: float | None,
        routed: Sequence[tuple[Band, ...]] | None = None,
        depth: float | None = None,
    ) -> FitJob | None:
        """``fresh`` taken in, and the fit to make now: None when it would be the last one
        again (the same window, accept length, profile, settings and crossover routed by:
        its replicates are seeded; a router serving only answers it cannot time makes no samples).
        ``routed``: the bands the policy routes by, per context bucket (None: the
        profile's): where they are bands, not one crossover, so are the live ones."""
        banded = tuple(_kind(b) for b in (_profiled(profile) if routed is None else routed))
        self.shared = shared
        self.samples.merge(fresh)
        window = self.samples.window(now)
        # the window only gains at its end and loses at its start: its ends and length say it
        ends = (window[0], window[-1]) if window else ()
        settings = (
            self.mode,
            self.sureness,
            self.per_level,
            self.accept_tolerance,
            self.at_prefill,
        )
        drafter = (accept_length, depth)
        made_from = (len(window), *ends, *drafter, profile, shared, banded, *settings)
        if self._fitted_on is not None and _same((*made_from, self.live_bands), self._fitted_on):
            self.fitted_at = now
            return None
        return FitJob(
            now,
            window,
            profile,
            accept_length,
            self.accept_tolerance,
            self.sureness.min_samples,
            self.per_level,
            made_from,
            shared,
            tuple(frozenset(f.live) for f in self.fits),
            banded,
            depth,
            self.at_prefill,
        )

    def settle(self, job: FitJob, made: Made) -> None:
        """What ``job`` made, in force: the fits, their drift from the profile and, in
        ``adopt``, the crossover routed by."""
        fits, self.left_out, self.beside = made
        profile, self.accept_length = job.profile, job.accept_length
        crossovers: tuple[Crossover, ...] | None = None
        if profile is not None:
            axis = profile.context
            buckets = (profile.crossover,) if axis is None else (b.crossover for b in axis.buckets)
            crossovers = tuple(buckets)
        self.fits, self.fitted_at = fits, job.now
        self.drift = tuple(
            crossovers is not None and self._drifted(f.crossing, c)
            for f, c in zip(fits, crossovers or [None] * len(fits), strict=True)
        )
        self._adopt(fits)
        self._fitted_on = (*job.made_from, self.live_bands)

    def _drifted(self, live: LiveCrossing | None, profiled: Crossover | None) -> bool:
        """The live interval no longer meets the profile's: only for a live crossing sure
        enough to adopt, so that thin evidence does not raise an alarm."""
        if profiled is None or not self.sureness.sure(live, holding=False):
            return False
        assert live is not None
        low, high = _span(live.low, live.high, live.at, live.bound, live.limit)
        ci = profiled.ci or (profiled.value, profiled.value)
        p_low, p_high = _span(ci[0], ci[1], profiled.value, profiled.bound, profiled.limit)
        return high < p_low or p_high < low

    def _adopt(self, fits: tuple[LiveFit, ...]) -> None:
        """Fails closed: only in ``adopt``, each context bucket's live crossing (a crossover,
        or bands) only while sure; one adopted stays while the fit holds it."""
        if self.mode is not OnlineMode.ADOPT:
            self.live_bands, self._held = (), ()
            return
        held = self._held if len(self._held) == len(fits) else (None,) * len(fits)
        chosen: list[LiveCrossing | None] = []
        for f, was in zip(fits, held, strict=True):
            found = f.crossing
            if self.sureness.sure(found, holding=False):
                chosen.append(found)
            elif was is not None and self.sureness.holds(found, was):
                chosen.append(was)
            else:
                chosen.append(None)
            if (was is None) != ((now := chosen[-1]) is None):
                context = "" if f.context is None else f" at context {f.context:g}"
                if now is not None:
                    _log.warning("Online: routing by the live bands%s: %s.", context, now.bands)
                else:
                    _log.warning(
                        "Online: the live crossing%s is no longer sure; the profile's again.",
                        context,
                    )
        adopting = any(c is not None for c in chosen)
        self._held = tuple(chosen) if adopting else ()
        self.live_bands = tuple(None if c is None else c.bands for c in chosen) if adopting else ()


def _profiled(profile: Profile | None) -> tuple[tuple[Band, ...], ...]:
    """The bands a profile routes by, per context bucket (one without a context axis; none
    without a profile)."""
    if profile is None:
        return ((),)
    if profile.context is None:
        return (profile.crossover.bands,)
    return tuple(b.crossover.bands for b in profile.context.buckets)


def _kind(bands: tuple[Band, ...]) -> bool | None:
    """Whether routing by ``bands`` is routing by bands (a mixture of experts'), not one
    crossover (a dense model's); None where it speculates nowhere: no profile's class."""
    return None if not bands else not _one(bands)


def _one(bands: tuple[Band, ...]) -> bool:
    """Bands that are one crossover (speculation nowhere and everywhere included)."""
    return up_to(first_top(bands)) == bands


def _apart(backend: ServerLoad, counts_others: bool) -> Lived:
    """``Online.lived`` for a server on GPUs of its own: its load alone, none beside it."""
    if counts_others:
        return lambda now: (
            backend.lived(now) + backend.others_lived(now),
            0.0,
            backend.prompted(),
        )
    return lambda now: (backend.lived(now), 0.0, backend.prompted())


def _same(a: tuple[object, ...], b: tuple[object, ...]) -> bool:
    """Two fits' inputs alike: the profile the same object, the rest equal."""
    return len(a) == len(b) and all(
        x is y if isinstance(x, Profile) else x == y for x, y in zip(a, b, strict=True)
    )


def shown(peer: dict[str, Any], now: float) -> dict[str, Any]:
    """A peer replica as ``/router/status`` shows it: its last error's time as an age."""
    at = peer.get("last_error_at")
    return {k: v for k, v in peer.items() if k != "last_error_at"} | {
        "last_error_seconds_ago": None if at is None else now - at
    }


def _span(
    low: float | None, high: float | None, at: float | None, bound: str | None, limit: float | None
) -> tuple[float, float]:
    """An interval as numbers, open ends infinite; a bound's from its limit outwards."""
    if at is None:
        edge = limit if limit is not None else (math.inf if bound == "above" else 0.0)
        return (edge, math.inf) if bound == "above" else (0.0, edge)
    return (0.0 if low is None else low), (math.inf if high is None else high)


def _levels(profile: Profile | None) -> tuple[float, ...]:
    """The profile's levels, where it measured; the default doubling levels without one."""
    given = _curves(profile)
    return DEFAULT_LEVELS if given is None else given.tpot["spec"].levels


def _curves(profile: Profile | None) -> Curves | None:
    if profile is None:
        return None
    try:
        return curves(profile)
    except ProfileError:
        return None


def _known(profile: Profile | None) -> Known | None:
    """The profile's TPOT at a level it measured."""
    given = _curves(profile)
    if given is None:
        return None
    tpot = given.tpot

    def at(pool: Pool, level: float) -> float | None:
        curve = tpot[pool]
        return curve.at(level) if curve.levels[0] <= level <= curve.levels[-1] else None

    return at


def _shape(profile: Profile | None) -> Shape | None:
    """The profile's TPOT at any load: its curve, flat below its first level and extended
    past its last."""
    given = _curves(profile)
    if given is None:
        return None
    tpot = given.tpot

    def at(pool: Pool, load: float) -> float:
        return tpot[pool].at(load)

    return at


def _shape_at_context(profile: Profile, context: float) -> Shape | None:
    """A ``v2`` profile's TPOT at any load, at ``context`` KV tokens."""
    given = context_curves(profile)
    if given is None:
        return None

    def at(pool: Pool, load: float) -> float:
        return given.at(pool, load, context)

    return at


def _at_context(profile: Profile, context: float) -> Known | None:
    """A ``v2`` profile's TPOT at a level it measured, at ``context`` KV tokens."""
    given = context_curves(profile)
    if given is None:
        return None
    levels = _levels(profile)

    def at(pool: Pool, level: float) -> float | None:
        return given.at(pool, level, context) if levels[0] <= level <= levels[-1] else None

    return at


def profiled(profile: Profile | None, context: float | None) -> Known | None:
    """The profile's TPOT at a level it measured, at ``context`` KV tokens for a fit of a
    context bucket: what a pool's level with too few live samples takes in that fit."""
    if profile is None:
        return None
    return _known(profile) if context is None else _at_context(profile, context)
