"""One line for each request, when it ends: its id, what was decided for it (pool,
server, policy, reason, the load it joined), how it ended (``Outcome``'s name and the
status answered), its time to the first byte and in all, and its tokens where the
answer's end says them. Never a key, a header or a body: each field is one the router
made or read as a number or a name."""

from __future__ import annotations

import logging
import time
from typing import Any

from aiohttp import web

from specroute.router.backends.flight import usage
from specroute.router.observability.lifecycle import Listener
from specroute.router.observability.record import RECORD, RequestRecord
from specroute.router.protocol.asked import Asked

LOG = logging.getLogger("specroute.router.access")
_PATH_SHOWN = 200  # characters of the path a line shows at most


class AccessLog(Listener):
    """The line of each request at its end (registered when ``access_log`` is on)."""

    def ended(self, record: RequestRecord, request: Asked, status: int | None) -> None:
        if LOG.isEnabledFor(logging.INFO):
            found = fields(record, request, status)
            shown = " ".join(
                f"{k}={v}" for k, v in found.items() if v is not None and k != "request_id"
            )
            LOG.info("request %s %s", found["request_id"], shown, extra={"fields": found})


def fields(record: RequestRecord, request: Asked, status: int | None) -> dict[str, Any]:
    """What the access line says of one request."""
    flight, decision = record.flight, record.decision
    found: dict[str, Any] = {
        "request_id": record.request_id,
        "method": request.method,
        "path": request.path[:_PATH_SHOWN],
        "status": status,
        "outcome": None if flight is None or flight.outcome is None else str(flight.outcome),
        "pool": None if decision is None else decision.pool,
        "backend": None if flight is None else flight.backend.name,
        "policy": record.policy,
        "reason": None if decision is None else decision.reason,
        "load": record.load,
        "attempts": record.attempts,
        "ttfb_s": None,
        "duration_s": round(time.monotonic() - record.started, 6),
    }
    if flight is not None:
        if flight.first_at is not None:
            found["ttfb_s"] = round(flight.first_at - record.started, 6)
        found.update(usage(flight.tail))
    return found


async def stamp(request: web.Request, response: web.StreamResponse) -> None:
    """``on_response_prepare``: every answer aiohttp sends names its request's id."""
    record = request.get(RECORD)
    if record is not None:
        response.headers[record.header] = record.request_id
