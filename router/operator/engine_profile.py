"""``/start_profile`` and ``/stop_profile`` (POST or GET, as SGLang takes them): every
server's torch profiler started or stopped, speculative and plain, so that one profile of
the deployment under load has a trace from each server (each writes its own, where its
``output_dir`` or ``SGLANG_TORCH_PROFILER_DIR`` says). A start's body, SGLang's
``ProfileReq`` (``output_dir``, ``num_steps``, ``activities``, ``profile_id``, ...), goes
to each server as it came, but for ``profile_prefix``: the server's pool, host and port
follow the one given (if any), so that each trace says whose it is, and servers that
share a folder do not write one file over another's with a ``profile_id`` given.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from specroute.router.backends.asking import Asking
from specroute.router.backends.backend import Backend
from specroute.router.operator.fan_out import answered, ask_every
from specroute.router.protocol.errors import error_response

START, STOP = "/start_profile", "/stop_profile"
_START_SECONDS = 60.0
_STOP_SECONDS = 600.0  # a server writes its traces before it answers: large ones take minutes


async def start_profile(request: web.Request, asking: Asking) -> web.Response:
    body = None
    if raw := await request.read():  # the front has read it whole, within body_timeout
        try:
            body = json.loads(raw)
        except ValueError:
            return error_response(400, "The profile request is not JSON.")
        if body is not None and not isinstance(body, dict):  # null: none, as on SGLang
            return error_response(400, "The profile request must be a JSON object.")
        if body and not isinstance(body.get("profile_prefix") or "", str):
            return error_response(400, "profile_prefix must be a string.", param="profile_prefix")
    asked = body or {}
    results = await ask_every(asking, START, _START_SECONDS, body=lambda b: _named(asked, b))
    if isinstance(results, web.Response):
        return results
    return answered(asking, results, "started", "profile start", "profile")


def _named(asked: dict[str, Any], backend: Backend) -> dict[str, Any]:
    """``asked`` with the server's name after its ``profile_prefix``."""
    given = asked.get("profile_prefix")
    own = backend.name.replace(":", "-")  # spec-10.0.0.1-30000
    return asked | {"profile_prefix": f"{given}-{own}" if given else own}


async def stop_profile(request: web.Request, asking: Asking) -> web.Response:
    results = await ask_every(asking, STOP, _STOP_SECONDS)
    if isinstance(results, web.Response):
        return results
    return answered(asking, results, "stopped", "profile stop", "profile")
