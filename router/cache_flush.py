"""``POST /flush_cache`` (or GET, as SGLang takes it): every server's radix cache flushed,
speculative and plain, so that a benchmark's measured run starts cold on all of them
(SGLang's ``bench_serving --flush-cache`` asks it after its warm-up).

``?timeout=S`` goes to each server, which then waits up to S seconds to fall idle (a
server with requests running refuses the flush otherwise). The answer is 200 only when
every server flushed; otherwise it says which did not and why: 400 when a server refused
(it was busy), 502 when one could not be asked or failed. A server that flushed stays
flushed either way, and the answer lists it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import aiohttp
from aiohttp import web

from specroute.router.backend import Backend
from specroute.router.content_coding import read_decoded
from specroute.router.errors import error_json, error_response
from specroute.router.server_info import redacted
from specroute.router.state import RouterState
from specroute.seconds import seconds

PATH = "/flush_cache"
_ANSWER_SECONDS = 30.0  # beyond the server's own wait for idle
_log = logging.getLogger("specroute.router")


async def flush_cache(request: web.Request, state: RouterState) -> web.Response:
    assert state.session is not None  # set at startup, before any request is served
    try:
        wait = seconds(request.query.get("timeout"))
    except ValueError as exc:
        return error_response(400, str(exc), param="timeout")
    backends = state.roster.backends
    if not backends:
        return error_response(503, "No backend to flush.", "service_unavailable", retry_after=1)
    session, secrets = state.session, state.settings.secrets()
    results = await asyncio.gather(*(_flushed(session, b, wait, secrets) for b in backends))
    failed = [r for r in results if r["status"] != 200]
    for r in failed:
        state.metrics.upstream_errors.labels(backend=r["backend"], kind="flush").inc()
        _log.warning("%s did not flush its cache (%s): %s", r["backend"], r["status"], r["said"])
    if not failed:
        return web.json_response({"flushed": True, "servers": results})
    busy = all(r["status"] == 400 for r in failed)
    status = 400 if busy else 502
    said = "; ".join(f"{r['backend']}: {r['said']}" for r in failed)
    message = f"{len(failed)} of {len(results)} servers did not flush their cache: {said}"
    kind = "invalid_request_error" if busy else "upstream_error"
    body = error_json(message, kind, status) | {"flushed": False, "servers": results}
    return web.json_response(body, status=status)


async def _flushed(
    session: aiohttp.ClientSession, backend: Backend, wait: float, secrets: list[str]
) -> dict[str, Any]:
    """One server's flush: its status (0: not asked to the end) and what it said."""
    limit = aiohttp.ClientTimeout(total=wait + _ANSWER_SECONDS)
    status, said = 0, ""
    try:
        async with session.post(
            f"{backend.url}{PATH}", params={"timeout": f"{wait:g}"}, timeout=limit
        ) as r:
            status, said = r.status, (await read_decoded(r)).decode(errors="replace").strip()
    except (aiohttp.ClientError, TimeoutError) as exc:
        said = f"unreachable ({type(exc).__name__})"
    except ValueError as exc:  # a coding not read here: the status still says it
        said = str(exc)
    said = redacted(said[:500], secrets)
    return {"backend": backend.name, "pool": backend.pool, "status": status, "said": said}
