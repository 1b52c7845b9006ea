"""``GET /router/profile/live``: the router's live fits as a profile document (admin key).

What ``specroute profile --from-live`` fetches; 409 while there is none to write, with the
reason and the samples the router has."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from aiohttp import web

from specroute.policies.view import POOLS
from specroute.router.online.live_profile import LiveProfileRefused, Serving, live_profile
from specroute.router.operator.watching import Watching
from specroute.router.protocol.errors import error_response

LIVE_PROFILE_PATH = "/router/profile/live"


async def live_profile_endpoint(request: web.Request, watching: Watching) -> web.Response:
    online, in_force = watching.online, watching.in_force
    now = time.monotonic()
    fitted = online.fitted_at
    if fitted is not None and time.time() - in_force.loaded_at < now - fitted:
        # the fit's profile-held values are of the profile before: not mixed with this one
        return error_response(
            409,
            "The profile in force changed since the last fit: ask again after the next one "
            f"(within {watching.online_settings.interval:g} s).",
        )
    try:
        document = live_profile(
            online,
            in_force.profile,
            serving(watching),
            now,
            datetime.now(UTC).isoformat(timespec="seconds"),
            exploring=watching.online_settings.explores(),
        )
    except LiveProfileRefused as exc:
        return error_response(409, str(exc))
    return web.json_response(document)


def serving(watching: Watching) -> Serving:
    """Each pool's backends and smallest reported batch, and the speculative servers'
    mean accept length over the windows younger than the online window (the span the
    live curves were measured over)."""
    view = watching.view()
    batches = {
        pool: [
            b.max_running_requests
            for b in view.backends
            if b.pool == pool and b.max_running_requests is not None
        ]
        for pool in POOLS
    }
    return Serving(
        {pool: tuple(b.name for b in view.backends if b.pool == pool) for pool in POOLS},
        {pool: min(batches[pool]) if batches[pool] else None for pool in POOLS},
        view.accept_length(watching.online_settings.window_seconds),
    )
