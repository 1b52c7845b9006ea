"""``POST /flush_cache`` (or GET, as SGLang takes it): every server's radix cache flushed,
speculative and plain, so that a benchmark's measured run starts cold on all of them
(SGLang's ``bench_serving --flush-cache`` asks it after its warm-up).

``?timeout=S`` goes to each server, which then waits up to S seconds to fall idle (a
server with requests running refuses the flush otherwise, and the answer is a 400).
"""

from __future__ import annotations

from aiohttp import web

from specroute.router.backends.asking import Asking
from specroute.router.operator.fan_out import answered, ask_every
from specroute.router.protocol.errors import error_response
from specroute.seconds import seconds

PATH = "/flush_cache"
_ANSWER_SECONDS = 30.0  # beyond the server's own wait for idle


async def flush_cache(request: web.Request, asking: Asking) -> web.Response:
    try:
        wait = seconds(request.query.get("timeout"))
    except ValueError as exc:
        return error_response(400, str(exc), param="timeout")
    results = await ask_every(asking, PATH, wait + _ANSWER_SECONDS, {"timeout": f"{wait:g}"})
    if isinstance(results, web.Response):
        return results
    return answered(asking, results, "flushed", "cache flush", "flush")
