"""What SGLang does on one server that an operator asks of the whole deployment: the same
request to every server of both pools at once (a cache flush, a profile started or
stopped, an abort; and a stored response looked for), and one answer that says what each
did.

The answer is 200 only when every server took it. Otherwise it names each that did not
and what it said: 400 when each of those refused the request (a flush while busy), 502
when one could not be asked or failed. What a server did stays done either way, and the
answer lists it. Each failure is counted (``specroute_upstream_errors_total``, by
``kind``) and logged; what a server said is cut short and has every key hidden.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from specroute.router.backends.asking import Asking
from specroute.router.backends.backend import Backend
from specroute.router.operator.server_info import redacted
from specroute.router.protocol.content_coding import read_decoded
from specroute.router.protocol.errors import error_json, error_response

_SAID_CHARS = 500
_log = logging.getLogger("specroute.router")
Body = Callable[[Backend], dict[str, Any]]  # what one server is sent


async def ask_every(
    asking: Asking,
    path: str,
    seconds: float,
    params: dict[str, str] | None = None,
    body: Body | None = None,
    method: str = "POST",
) -> list[dict[str, Any]] | web.Response:
    """Every server's answer to ``method path``, within ``seconds`` each; a 503 when the
    router has none."""
    backends, session = asking.backends, asking.client()
    if not backends:
        return error_response(503, "No backend to ask.", "service_unavailable", retry_after=1)
    secrets = asking.secrets()
    limit = aiohttp.ClientTimeout(total=seconds)
    asked = (_asked(session, method, b, path, limit, params, body, secrets) for b in backends)
    return list(await asyncio.gather(*asked))


def answered(
    asking: Asking, results: list[dict[str, Any]], key: str, what: str, kind: str
) -> web.Response:
    """The one answer: ``{key: true, "servers": [...]}`` when every server took it, else
    the error that says where ``what`` failed (``kind`` counts them)."""
    failed = [r for r in results if not 200 <= r["status"] < 300]
    for r in failed:
        asking.upstream_errors.labels(backend=r["backend"], kind=kind).inc()
        _log.warning("%s: %s failed (%s): %s", r["backend"], what, r["status"], r["said"])
    if not failed:
        return web.json_response({key: True, "servers": results})
    refused = all(r["status"] == 400 for r in failed)
    status = 400 if refused else 502
    said = "; ".join(f"{r['backend']}: {r['said']}" for r in failed)
    message = f"The {what} failed on {len(failed)} of {len(results)} servers: {said}"
    error_type = "invalid_request_error" if refused else "upstream_error"
    body = error_json(message, error_type, status) | {key: False, "servers": results}
    return web.json_response(body, status=status)


async def _asked(
    session: aiohttp.ClientSession,
    method: str,
    backend: Backend,
    path: str,
    limit: aiohttp.ClientTimeout,
    params: dict[str, str] | None,
    body: Body | None,
    secrets: list[str],
) -> dict[str, Any]:
    """One server's status (0: not asked to the end) and what it said."""
    status, said = 0, ""
    sent = None if body is None else body(backend)
    try:
        async with session.request(
            method, f"{backend.url}{path}", params=params, json=sent, timeout=limit
        ) as r:
            status, said = r.status, (await read_decoded(r)).decode(errors="replace").strip()
    except (aiohttp.ClientError, TimeoutError) as exc:
        said = f"unreachable ({type(exc).__name__})"
    except ValueError as exc:  # a coding not read here: the status still says it
        said = str(exc)
    said = redacted(said[:_SAID_CHARS], secrets)
    return {"backend": backend.name, "pool": backend.pool, "status": status, "said": said}
