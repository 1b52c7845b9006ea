"""``GET /v1/models/{model}``: one model's card, from the first healthy backend that
serves it (the openai client's ``models.retrieve()``); OpenAI's 404 for a model none
serves."""

from __future__ import annotations

import json
from urllib.parse import quote

import aiohttp
from aiohttp import web

from specroute.router.backends.asking import Asking
from specroute.router.protocol.content_coding import read_decoded
from specroute.router.protocol.errors import error_response


async def model_card(request: web.Request, asking: Asking) -> web.Response:
    name = request.match_info["model"]
    asked = 0
    for backend in asking.backends:
        if not backend.healthy:
            continue
        try:
            async with asking.client().get(f"{backend.url}/v1/models/{quote(name)}") as r:
                if r.status == 200:
                    card = json.loads(await read_decoded(r))
                    if isinstance(card, dict) and card.get("id") == name:
                        return web.json_response(card)
                asked += 1  # it answered: not its model
        except (aiohttp.ClientError, TimeoutError, ValueError):
            asking.failed(backend, "models")
    if not asked:
        return error_response(503, "No healthy backend answered.", "service_unavailable")
    return error_response(
        404,
        f"The model '{name}' does not exist",
        param="model",
        code="model_not_found",
    )
