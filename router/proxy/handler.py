"""Forward one request to the backend a policy chose, relaying the answer as it arrives.

Three steps. *Choose* (``choice``): read from the body what the policy needs, ask it,
record its decision. Then at one server (``attempt``), *open*: send the body upstream byte
for byte (SGLang's extra fields survive) and wait for the first byte of the answer;
nothing has reached the client yet, so a connection error, a 503 or an answer that breaks
now is retried once on the other pool. *Relay*: committed; the answer goes back chunk by
chunk with its status and content type, and a backend that fails from here ends a stream
with an SSE error event and a plain body with a cut connection, never a silent truncation
or a retry. Each backend's in-flight count and estimated KV tokens go up at dispatch and
down in one place whatever happens, and how the request ended there is one ``Outcome``.
What the router learns of the request goes in its record (``RequestRecord``), and every
request's listeners hear each step from it (``Lifecycle``, registered in ``listeners``):
nothing else is called from here.
"""

from __future__ import annotations

from aiohttp import web

from specroute.router.observability.record import RequestRecord
from specroute.router.protocol.asked import Proxied
from specroute.router.protocol.errors import error_response
from specroute.router.protocol.outcome import Outcome
from specroute.router.proxy.attempt import attempt
from specroute.router.proxy.choice import STORED, choose, decided, retry_decision
from specroute.router.proxy.proxying import Proxying
from specroute.router.proxy.upstream_call import Failure

PROXIED = ("/v1/chat/completions", "/v1/completions", "/v1/responses", "/generate")


async def serve(request: Proxied, proxying: Proxying, record: RequestRecord) -> web.Response | None:
    """A proxied request served: a refusal not yet sent, or None, answered through its
    reply; ``record``: what the router knows of it, which the front opened. Each coroutine
    between the server and the relay is stepped through again at every resumption (every
    chunk of a stream), so the request is served in as few as it can be: one more only
    when it is traced."""
    if (tracing := proxying.tracing) is None:
        return await _proxy(request, proxying, record)
    span = record.span = tracing.start(request)
    status: int | None = None
    try:
        refusal = await _proxy(request, proxying, record)
        status = request.reply().status if refusal is None else refusal.status
        return refusal
    finally:
        span.end(status)


async def _proxy(
    request: Proxied, proxying: Proxying, record: RequestRecord
) -> web.Response | None:
    choosing, attempting = proxying.choosing, proxying.attempting
    chosen = await choose(request, choosing, record)
    if isinstance(chosen, web.Response):
        return chosen  # refused: shutting down, or a body the router cannot read
    raw, body, decision, tokens = chosen
    tried: set[str] = set()
    try:
        while decision.backend is not None:
            backend = attempting.asking.roster.backend(decision.backend)
            tried.add(backend.name)
            try:
                return await attempt(request, attempting, record, backend, raw, body, tokens)
            except Failure as failure:  # nothing reached the client: once more, elsewhere
                if decision.reason == STORED:  # no other server holds what it goes on from
                    return _gave_up(failure)
                decision = retry_decision(choosing, decision.pool, tried)
                if decision.backend is None:
                    return _gave_up(failure)
                decided(choosing, record, decision, choosing.view().load())
        return error_response(
            503,
            "No healthy backend can serve this request.",
            "service_unavailable",
            retry_after=proxying.retry_after,
        )
    finally:
        choosing.admission.release()


def _gave_up(failure: Failure) -> web.Response:
    """Every backend tried failed before its first byte: busy ones say when to come back."""
    if failure.outcome is Outcome.UNAVAILABLE:
        return error_response(
            503, f"Every backend tried is busy: {failure}", "service_unavailable", retry_after=1
        )
    return error_response(502, f"The backend failed: {failure}", "upstream_error")
