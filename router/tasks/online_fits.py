"""The background task that fits the live curves, off the request path; before each fit,
the leader takes its peer replicas' new samples (``router.online.peers``). It is given what
it uses of the router's state (``Fitted``; the state is one), not the state's class."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Protocol

import aiohttp

from specroute.crossing import Band
from specroute.online.estimator import Online
from specroute.online.exploration import policy_bands
from specroute.online.samples import Sample
from specroute.policies.policy import Policy
from specroute.policies.profile import Profile, up_to
from specroute.policies.view import View
from specroute.router.online.peers import Peers
from specroute.router.tasks.held import Held

_log = logging.getLogger("specroute.router")

PEER_TIMEOUT = 2.0  # seconds a peer's answer may take at most (less with a shorter interval)


class Fitted(Held, Protocol):
    """What the fits use of the router's state: the estimator, the policy in force and the
    view they fit for, the peers, the fitter thread, the counters, and the publishing of a
    fit to the other workers."""

    @property
    def online(self) -> Online: ...
    @property
    def peers(self) -> Peers | None: ...
    @property
    def fitter(self) -> Executor | None: ...
    def view(self) -> View: ...
    def publish_online(self, fitted: bool = True) -> None: ...


async def keep_fitting(state: Fitted) -> None:
    """Every ``online_interval`` seconds, until cancelled; a failed fit is logged and
    counted (``specroute_background_errors_total{task="online"}``), routing goes back to the
    profile's crossover in every worker (a live one no fit stands behind is not routed by),
    and the next fit comes. With peers, one session of their own for the task's life,
    sending the admin key to them alone."""
    errors = state.metrics.background_errors.labels(task="online")  # 0 from the start
    async with contextlib.AsyncExitStack() as stack:
        session = None
        key = state.settings.admin_key
        if state.peers is not None and key is not None:
            headers = {"Authorization": f"Bearer {key.get_secret_value()}"}
            session = await stack.enter_async_context(aiohttp.ClientSession(headers=headers))
        timeout = min(PEER_TIMEOUT, max(state.settings.online.interval, 0.5))
        while True:
            await asyncio.sleep(state.settings.online.interval)
            taken: list[Sample] = []
            if state.peers is not None and session is not None:
                try:
                    taken = await state.peers.pull(session, timeout)
                except Exception:  # a bug to see: the fit goes on from this router's own
                    errors.inc()
                    _log.exception("Taking the peers' online samples failed; it goes on.")
                state.online.peers = state.peers.describe()
            try:
                await fit_now(state, taken)
            except Exception:
                state.online.adopted = None
                state.publish_online(fitted=False)  # a store on the board: it does not fail
                errors.inc()
                _log.exception("The online fit failed; the profile's crossover until one works.")


def fitter() -> ThreadPoolExecutor:
    """The thread the fits run in (``fit_now``), started now: one for the router's life,
    so that it has the threads while it serves that it had when it started."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="specroute-fit")
    pool.submit(int).result()  # its thread starts with its first job
    return pool


async def fit_now(state: Fitted, taken: Sequence[Sample] = ()) -> None:
    """One fit, with the profile and the topology in force, ``taken``, the peers' samples
    since the last, and the speculative pool's accept length now (its healthy servers'
    readings within the online window, as the live profile records it), published for the
    other workers. Its heavy steps run in the router's fitter thread (``state.fitter``;
    without one, the event loop's default pool), off the event loop: reading the other
    workers' rings and fitting are tens of milliseconds of Python at thousands of samples,
    which on the loop held back every request of this worker for as long, every
    ``online_interval``. A fit made while another profile was posted is not put in force:
    the next one is made with it."""
    online, in_force, loop = state.online, state.in_force, asyncio.get_running_loop()
    shared = shares_gpus(in_force.policy)
    accept, depth = drafting_now(state)
    fresh = await loop.run_in_executor(state.fitter, online.fresh)
    routed = routed_bands(in_force.policy, in_force.profile)
    job = online.prepare(
        time.monotonic(), in_force.profile, shared, [*taken, *fresh], accept, routed, depth
    )
    if job is not None:
        made = await loop.run_in_executor(state.fitter, job.run)
        if state.in_force.profile is not job.profile:
            return
        online.settle(job, made)
    state.publish_online()


def drafting_now(state: Fitted) -> tuple[float | None, float | None]:
    """The speculative pool's accept length now, and the one draft depth its servers run
    at (None: unknown); neither when they run at different depths, where the pool's accept
    length mixes depths that accept differently (adaptive servers), and no sample is
    compared with it."""
    now, stale = time.monotonic(), state.settings.health.stale_after
    readings = [b.reading(stale, now) for b in state.roster.backends if b.pool == "spec"]
    depths = {r.spec_depth for r in readings if r is not None}
    if len(depths) > 1:
        return None, None
    accept = state.view().accept_length(state.settings.online.window_seconds)
    return accept, next(iter(depths), None)


def routed_bands(policy: Policy, profile: Profile | None) -> tuple[tuple[Band, ...], ...] | None:
    """The bands the policy routes by, for one context: its own (a profile's, or its
    crossover as one band); None: with context buckets, the profile's per bucket."""
    if profile is not None and profile.context is not None:
        return None
    given = policy_bands(policy)
    if given is None:
        return None
    return (given,) if isinstance(given, tuple) else (up_to(given),)


def shares_gpus(policy: Policy) -> bool:
    """Whether the policy counts the load a request joins as its GPU group's (``topology``
    shared, and for a policy without one), or as its server's own (partitioned)."""
    topology = getattr(getattr(policy, "params", None), "topology", "shared")
    return bool(topology != "partitioned")
