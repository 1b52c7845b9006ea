"""The router's gauges, read at each scrape from what the operator watches (``Watching``):
nothing on the request path sets them, and they are the deployment's whichever worker
answers (in flight and readings come from the shared board). A cool-down ends with no event
to set a gauge at; read, it shows."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from specroute.crossing import first_top
from specroute.policies.profile import up_to
from specroute.router.online.gauges import online_gauges
from specroute.router.operator.watching import Watching


class RouterGauges(Collector):
    def __init__(self, watching: Watching) -> None:
        self.watching = watching

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        watching = self.watching
        view = watching.view()
        board = watching.board
        board.show_cpu(time.process_time())  # this worker's now, the others' of their last tick
        yield CounterMetricFamily(
            "specroute_router_cpu_seconds",
            "CPU time of the router's worker processes (user and system), summed.",
            value=board.cpu_seconds(),
        )
        yield GaugeMetricFamily(
            "specroute_router_workers", "The router's worker processes.", value=board.workers
        )
        yield GaugeMetricFamily(
            "specroute_live_concurrency",
            "The live concurrency of the whole deployment as the policy counts it, now.",
            value=view.load(),
        )
        quota = watching.quota
        yield GaugeMetricFamily(
            "specroute_admitted_requests",
            "Requests admitted and not yet ended, through every worker (what "
            "max_concurrent_requests limits).",
            value=quota.admitted(),
        )
        yield GaugeMetricFamily(
            "specroute_queue_depth",
            "Requests waiting for admission, through every worker.",
            value=quota.queued(),
        )
        policy, profile = watching.in_force.policy, watching.in_force.profile
        crossover = policy.crossover()
        live = watching.online.live_bands
        routed = live[0] if len(live) == 1 and policy.name == "crossover" else None
        if routed is not None and crossover is not None:
            crossover = first_top(routed)  # what it routes by now: learned live (adopt)
        if crossover is not None:
            yield GaugeMetricFamily(
                "specroute_crossover", "The crossover the policy routes by.", value=crossover
            )
        bands = getattr(policy, "bands", None)
        if routed is not None and (bands is not None or up_to(first_top(routed)) != routed):
            bands = routed  # live bands stand for the profile's
        if bands is not None:
            edges = GaugeMetricFamily(
                "specroute_band_edge",
                "The edges of the bands of load where the policy speculates (from a profile "
                "with bands): band is its rank from the lowest load, edge from or to.",
                labels=["band", "edge"],
            )
            for rank, band in enumerate(bands):
                for edge, value in zip(("from", "to"), band, strict=True):
                    if value is not None:
                        edges.add_metric([str(rank), edge], value)
            yield edges
        note = None if profile is None else profile.crossover.note
        yield GaugeMetricFamily(
            "specroute_crossover_measured",
            "1 when the profile's crossover was measured; 0 when speculation paid (or lost) at "
            "every level measured and the router routes by the edge of what was measured.",
            value=0 if note else 1,
        )
        yield from self._profile()
        yield from online_gauges(watching.online, profile)
        yield from self._backends()

    def _profile(self) -> Iterator[GaugeMetricFamily]:
        """What the profile in force was measured at, and when: for alerts on a live accept
        length far from it, and on a profile grown old."""
        profile = self.watching.in_force.profile
        if profile is None:
            return
        if profile.accept_length is not None:
            yield GaugeMetricFamily(
                "specroute_profile_accept_length",
                "The mean accept length the profile in force was measured at.",
                value=profile.accept_length,
            )
        if contexts := profile.contexts:
            measured = GaugeMetricFamily(
                "specroute_profile_context_tokens",
                "The context (mean KV tokens per request while it decodes: prompt plus half "
                "the answer) the profile in force was measured at, per context bucket.",
                labels=["bucket"],
            )
            for i, context in enumerate(contexts):
                measured.add_metric([str(i)], context)
            yield measured
        age = profile.age_seconds()
        if age is not None:
            yield GaugeMetricFamily(
                "specroute_profile_created_timestamp_seconds",
                "When the measurement of the profile in force ended (Unix time).",
                value=time.time() - age,
            )

    def _backends(self) -> Iterator[GaugeMetricFamily]:
        inflight = GaugeMetricFamily(
            "specroute_inflight",
            "Requests in flight through the router (all its workers).",
            labels=["pool", "backend"],
        )
        kv_tokens = GaugeMetricFamily(
            "specroute_kv_tokens_inflight",
            "The estimated context (KV tokens: prompt plus half the output limit) of the "
            "requests in flight through the router (all its workers).",
            labels=["pool", "backend"],
        )
        healthy = GaugeMetricFamily(
            "specroute_backend_healthy",
            "1 when the backend may get traffic now: its breaker is closed, or half-open "
            "with no request in flight there, and no worker has it ejected.",
            labels=["backend"],
        )
        breaker = GaugeMetricFamily(
            "specroute_backend_breaker_state",
            "The backend's circuit breaker, the worst of the workers': 0 closed (serving), "
            "1 half-open (one trial at a time), 2 open (ejected, no traffic).",
            labels=["backend"],
        )
        running = GaugeMetricFamily(
            "specroute_backend_running", "Running requests the backend reports.", labels=["backend"]
        )
        queued = GaugeMetricFamily(
            "specroute_backend_queued", "Queued requests the backend reports.", labels=["backend"]
        )
        accept = GaugeMetricFamily(
            "specroute_backend_accept_length",
            "Accept length over the last polling window, from counter deltas.",
            labels=["backend"],
        )
        depth = GaugeMetricFamily(
            "specroute_backend_spec_depth",
            "The draft depth the backend runs at now (SGLang's sglang:spec_num_steps): an "
            "adaptive server's (--speculative-adaptive) moves with its batch, 0 drafting none.",
            labels=["backend"],
        )
        for b in self.watching.backends:
            b.show_level()  # this worker's, now; the others' as they last showed it
            up, worst = b.healthy, b.board.worst_level(b.index)
            inflight.add_metric([b.pool, b.name], b.inflight)
            kv_tokens.add_metric([b.pool, b.name], b.kv_tokens)
            healthy.add_metric([b.name], int(up and worst < 2))
            breaker.add_metric([b.name], worst)
            reading = b.board.reading(b.index)  # the last, however old, as before
            if reading is None:
                continue
            for family, value in (
                (running, reading.running),
                (queued, reading.queued),
                (accept, reading.accept_length),
                (depth, reading.spec_depth),
            ):
                if value is not None:
                    family.add_metric([b.name], value)
        yield from (inflight, kv_tokens, healthy, breaker, running, queued, accept, depth)
