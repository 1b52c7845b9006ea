"""What the request path uses of the router, and nothing else of it, by step: ``Choosing``
(step 1, ``choice``), ``Attempting`` (steps 2 and 3 at one server, ``attempt``), and
``Proxying``, the two with what the handler itself reads. The app builds them from the
parts its state holds, once; the proxy never sees the state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from specroute.online.estimator import Online
from specroute.policies.decision import Decision
from specroute.policies.view import RequestInfo, View
from specroute.router.admission.limits import Admission
from specroute.router.admission.rate_limit import RateLimit
from specroute.router.backends.asking import Asking
from specroute.router.backends.relaying import Relaying
from specroute.router.metrics import RouterMetrics
from specroute.router.observability.lifecycle import Lifecycle
from specroute.router.observability.tracing import Tracing
from specroute.router.policy_in_force import PolicyInForce
from specroute.router.proxy.stored_responses import StoredResponses


@dataclass(frozen=True, slots=True)
class Choosing:
    """Step 1: the load now and the policy asked at it, admission and the limits before it,
    and the stored responses a request may go on from."""

    view: Callable[[], View]  # the backends as routed by now (the other workers followed)
    place: Callable[[Decision, RequestInfo, View], Decision]  # explored, placed in its pool
    in_force: PolicyInForce
    admission: Admission
    rate_limit: RateLimit | None
    draining: Callable[[], bool]  # new requests refused: the router is stopping
    queue_at_capacity: bool
    prefix_bytes: int  # of a prompt, what placement hashes
    rids: set[str]  # the ids sent as SGLang's rid, of requests in flight
    stored: StoredResponses
    lifecycle: Lifecycle


@dataclass(frozen=True, slots=True)
class Attempting:
    """Steps 2 and 3 at one server: the servers and what asks them, the upstream
    connections, the online estimator that counts each server's load, the metrics a flight
    keeps, and the aborts sent in the background."""

    asking: Asking
    relaying: Relaying
    online: Online
    metrics: RouterMetrics
    background: set[asyncio.Task[None]]
    lifecycle: Lifecycle


@dataclass(frozen=True, slots=True)
class Proxying:
    """The request path's context: both steps', the spans and the wait a refusal names."""

    choosing: Choosing
    attempting: Attempting
    tracing: Tracing | None  # OpenTelemetry, when on
    retry_after: float  # seconds a client is told to wait when no backend is healthy


PROXYING = web.AppKey("proxying", Proxying)  # where the aiohttp app keeps it
