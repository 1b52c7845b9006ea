"""``GET /router/online/samples?after=CURSOR``: this router's own online samples since the
cursor, for its peer replicas (admin key; ``router.online.peer_answer`` says the shape).

Own only: the samples its workers recorded (its rings), never those it took from peers,
so that no sample comes back to the replica that served it, nor goes round. Any worker
answers, from the rings every worker shares; the newest of them only, as many as a fit
keeps and none older than the online window, which a peer would not count.
"""

from __future__ import annotations

import time

import orjson
from aiohttp import web

from specroute.online.estimator import OnlineMode
from specroute.router.online.peer_answer import answer
from specroute.router.online.rings import Rings
from specroute.router.protocol.errors import error_response
from specroute.router.settings.online import OnlineSettings


async def online_samples_endpoint(
    request: web.Request, rings: Rings | None, settings: OnlineSettings
) -> web.Response:
    """Given the rings its workers record in (None: online off) and the online settings,
    not the router's state."""
    if settings.mode is OnlineMode.OFF or rings is None:
        return error_response(409, "Online calibration is off: this router records no samples.")
    try:
        samples, cursor = rings.after(request.query.get("after"))
    except ValueError as exc:
        return error_response(400, f"The cursor does not read: {exc}")
    now = time.monotonic()
    oldest = now - settings.window_seconds
    recent = [s for s in samples if s.at >= oldest][-settings.kept() :]
    body = orjson.dumps(answer(rings.epoch, cursor, recent, now))
    return web.Response(body=body, content_type="application/json")
