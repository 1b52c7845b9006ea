"""``GET /v1/models/{model}``: one model's card, from the first healthy backend that
serves it (the openai client's ``models.retrieve()``); OpenAI's 404 for a model none
serves."""

from __future__ import annotations

import json
from urllib.parse import quote

import aiohttp
from aiohttp import web

from specroute.router.protocol.content_coding import read_decoded
from specroute.router.protocol.errors import error_response
from specroute.router.state import RouterState


async def model_card(request: web.Request, state: RouterState) -> web.Response:
    assert state.session is not None  # set at startup, before any request is served
    name = request.match_info["model"]
    asked = 0
    for backend in state.roster.backends:
        if not backend.healthy:
            continue
        try:
            async with state.session.get(f"{backend.url}/v1/models/{quote(name)}") as r:
                if r.status == 200:
                    card = json.loads(await read_decoded(r))
                    if isinstance(card, dict) and card.get("id") == name:
                        return web.json_response(card)
                asked += 1  # it answered: not its model
        except (aiohttp.ClientError, TimeoutError, ValueError):
            state.metrics.upstream_errors.labels(backend=backend.name, kind="models").inc()
    if not asked:
        return error_response(503, "No healthy backend answered.", "service_unavailable")
    return error_response(
        404,
        f"The model '{name}' does not exist",
        param="model",
        code="model_not_found",
    )
