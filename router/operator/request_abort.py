"""``POST /abort_request``: SGLang's abort by name (``{"rid": ...}``), or of everything
running (``{"abort_all": true}``), asked of every server of both pools, since the router
passes a client's ``rid`` on as it came and any server may hold it. A server that holds no
such request answers 200 all the same, as SGLang does; one without the endpoint (vLLM)
answers 404, and the answer names it.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from specroute.router.backends.asking import Asking
from specroute.router.operator.fan_out import answered, ask_every
from specroute.router.protocol.errors import error_response

PATH = "/abort_request"
_ANSWER_SECONDS = 30.0


async def abort_request(request: web.Request, asking: Asking) -> web.Response:
    try:
        body = json.loads(await request.read())
    except ValueError:
        return error_response(400, "The abort request is not JSON.")
    sent: dict[str, Any]
    if isinstance(body, dict) and body.get("abort_all") is True:
        sent = {"abort_all": True}
    elif isinstance(body, dict) and isinstance(rid := body.get("rid"), str) and rid:
        sent = {"rid": rid}
    else:
        return error_response(
            400, 'Give the request\'s "rid" (a string), or "abort_all": true.', param="rid"
        )
    results = await ask_every(asking, PATH, _ANSWER_SECONDS, body=lambda _: sent)
    if isinstance(results, web.Response):
        return results
    return answered(asking, results, "aborted", "abort", "abort")
