"""The background task that fits the live curves, off the request path."""

from __future__ import annotations

import asyncio
import logging
import time

from specroute.policies.policy import Policy
from specroute.router.state import RouterState

_log = logging.getLogger("specroute.router")


async def keep_fitting(state: RouterState) -> None:
    """Every ``online_interval`` seconds, until cancelled; a failed fit is logged and
    counted (``specroute_background_errors_total{task="online"}``), routing goes back to the
    profile's crossover in every worker (a live one no fit stands behind is not routed by),
    and the next fit comes."""
    errors = state.metrics.background_errors.labels(task="online")  # 0 from the start
    while True:
        await asyncio.sleep(state.settings.online_interval)
        try:
            fit_now(state)
        except Exception:
            state.online.adopted = None
            state.publish_online(fitted=False)  # a store on the board: it does not fail
            errors.inc()
            _log.exception("The online fit failed; the profile's crossover until one works.")


def fit_now(state: RouterState) -> None:
    """One fit, with the profile and the topology in force, published for the other
    workers."""
    in_force = state.in_force
    state.online.refit(time.monotonic(), in_force.profile, shares_gpus(in_force.policy))
    state.publish_online()


def shares_gpus(policy: Policy) -> bool:
    """Whether the policy counts the load a request joins as its GPU group's (``topology``
    shared, and for a policy without one), or as its server's own (partitioned)."""
    topology = getattr(getattr(policy, "params", None), "topology", "shared")
    return bool(topology != "partitioned")
