"""The Responses API's stored responses. SGLang keeps a response (``--enable-response-store``)
on the server that made it, so whatever names one must reach that server, whatever the
load: a request that goes on from it (``previous_response_id``), ``GET
/v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``.

The router finds that server by asking every server for the response (``GET
/v1/responses/{id}``, at once) and remembers the answer for the next turn (each worker
its own, the most recent ``Owners`` holds; one whose server left is looked for again). None
having it is the servers' own 404; every server refusing to look
(the store off, an id that is not one) is their own 400 passed on; a server that could not
be asked while none had it is a 502 that names it, counted (``kind="responses"``), since
the response may be there.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from urllib.parse import quote

import aiohttp
from aiohttp import web

from specroute.router.admission.auth import without_credentials
from specroute.router.backends.asking import Asking
from specroute.router.backends.backend import Backend
from specroute.router.backends.response_owners import Owners
from specroute.router.operator.fan_out import ask_every
from specroute.router.protocol.content_coding import read_decoded
from specroute.router.protocol.errors import error_response

PATH = "/v1/responses"
_ASK_SECONDS = 10.0
_log = logging.getLogger("specroute.router")


@dataclass(frozen=True, slots=True)
class StoredResponses:
    """What finding a stored response's server takes: the servers asked (``asking``) and
    the ones found before (``owners``, this worker's)."""

    asking: Asking
    owners: Owners


async def owner(responses: StoredResponses, response_id: str, param: str) -> Backend | web.Response:
    """The server that holds ``response_id``, or the answer that says why none can be
    named (``param``: the field that named it, for the error)."""
    asking = responses.asking
    backends = {b.name: b for b in asking.backends}
    if (name := responses.owners.get(response_id)) is not None and name in backends:
        return backends[name]
    path = f"{PATH}/{quote(response_id, safe='')}"
    answers = await ask_every(asking, path, _ASK_SECONDS, method="GET")
    if isinstance(answers, web.Response):
        return answers  # no backend to ask
    for answer in answers:
        if answer["status"] == 200 and answer["backend"] in backends:
            responses.owners.put(response_id, answer["backend"])
            return backends[answer["backend"]]
    failed = [a for a in answers if a["status"] not in (400, 404)]
    if failed:
        for a in failed:
            asking.upstream_errors.labels(backend=a["backend"], kind="responses").inc()
            _log.warning(
                "%s: looking for a stored response failed (%s): %s",
                a["backend"],
                a["status"],
                a["said"],
            )
        named = "; ".join(f"{a['backend']}: {a['said'] or a['status']}" for a in failed)
        return error_response(
            502,
            f"Response '{response_id}' is on none of the servers that answered, and "
            f"{len(failed)} could not be asked: {named}",
            "upstream_error",
            param=param,
        )
    if all(a["status"] == 400 for a in answers):  # the store off, or not an id
        said = _message(answers[0]["said"])
        return error_response(400, f"The servers refused to look for it: {said}", param=param)
    return error_response(
        404, f"Response with id '{response_id}' not found on any server.", param=param
    )


def _message(said: str) -> str:
    """The message of an error body (OpenAI's nested shape, or SGLang's flat one), else
    what was said."""
    try:
        body = json.loads(said)
    except ValueError:
        return said
    error = body.get("error", body) if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) else said


async def stored(request: web.Request, responses: StoredResponses) -> web.Response:
    """``GET /v1/responses/{id}`` and ``POST /v1/responses/{id}/cancel``: asked of the
    server that holds the response, its answer passed on as it came."""
    response_id = request.match_info["response_id"]
    found = await owner(responses, response_id, "response_id")
    if isinstance(found, web.Response):
        return found
    path = request.path.removeprefix(PATH + "/" + response_id)
    url = f"{found.url}{PATH}/{quote(response_id, safe='')}{path}"
    limit = aiohttp.ClientTimeout(total=_ASK_SECONDS)
    try:
        async with responses.asking.client().request(request.method, url, timeout=limit) as r:
            body = await read_decoded(r)
            status, kind = r.status, r.content_type
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        responses.asking.failed(found, "responses")
        return error_response(
            502,
            f"{without_credentials(found.url)} could not be asked: {type(exc).__name__}",
            "upstream_error",
        )
    headers = {"x-specroute-backend": found.name}
    return web.Response(body=body, status=status, content_type=kind, headers=headers)
