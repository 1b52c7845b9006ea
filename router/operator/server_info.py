"""``GET /server_info`` and ``GET /model_info`` (and SGLang's older names for them): one
server's answer, relayed, so that the tools that ask SGLang for them (its own
``bench_serving`` reads the tokenizer from ``/model_info`` and keeps ``/server_info`` in
its results) work through the router as through SMG.

The answer is a healthy speculative server's where there is one (its drafter's settings,
and the accept length where the server reports one there), else a plain one's;
``x-specroute-backend`` names it. A server that answers 404 is asked by the other name (an
older SGLang, or an SMG in front of a pool). SGLang lists every argument it was started
with, its API keys and its command line among them: whatever looks like a secret, and any
key the router holds, is replaced before the answer leaves the router.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Sequence
from typing import Any

import aiohttp
from aiohttp import web

from specroute.router.backends.asking import Asking
from specroute.router.backends.backend import Backend
from specroute.router.protocol.content_coding import read_decoded
from specroute.router.protocol.errors import error_response

SERVER_INFO = ("/server_info", "/get_server_info")
MODEL_INFO = ("/model_info", "/get_model_info")
HIDDEN = "<redacted>"
_INFO_SECONDS = 30.0  # a small answer: a server slower than this is failing
_SECRET_NAME = re.compile(r"(^|_)(keys?|secrets?|password|passwd)$", re.IGNORECASE)
# a token is a secret when it is text: SGLang's ``bucket_time_to_first_token`` is not
_TOKEN_NAME = re.compile(r"(^|_)token$", re.IGNORECASE)
_SECRET_FLAG = re.compile(r"(--[\w-]*?(?:key|secret|password|passwd|token)[ =])(\S+)", re.I)
_SHORTEST_SEARCHED = 8  # a key shorter than this is hidden where a whole string is it
_log = logging.getLogger("specroute.router")


async def relay_info(request: web.Request, asking: Asking, names: tuple[str, ...]) -> web.Response:
    """The first answer of the healthy servers, speculative first, asked by ``names``."""
    healthy = [b for b in asking.backends if b.healthy]
    healthy.sort(key=lambda b: b.pool != "spec")
    if not healthy:
        return error_response(
            503, "No healthy backend to ask.", "service_unavailable", retry_after=1
        )
    failures = []
    for backend in healthy:
        answer = await _asked(asking.client(), backend, names)
        if isinstance(answer, dict):
            return web.json_response(
                redacted(answer, asking.secrets()), headers={"x-specroute-backend": backend.name}
            )
        asking.failed(backend, "info")
        _log.warning("No answer to %s from %s: %s.", names[0], backend.name, answer)
        failures.append(f"{backend.name}: {answer}")
    return error_response(
        502, f"No backend answered {names[0]}: {'; '.join(failures)}.", "upstream_error"
    )


async def _asked(
    session: aiohttp.ClientSession, backend: Backend, names: tuple[str, ...]
) -> dict[str, Any] | str:
    """The server's answer as JSON, or why there is none."""
    limit = aiohttp.ClientTimeout(total=_INFO_SECONDS)
    status = 404
    for name in names:
        try:
            async with session.get(f"{backend.url}{name}", timeout=limit) as r:
                status = r.status
                if status == 404:
                    continue
                if status != 200:
                    return f"{name} answered {status}"
                body = json.loads(await read_decoded(r))
        except (aiohttp.ClientError, TimeoutError) as exc:
            return f"{name} unreachable ({type(exc).__name__})"
        except ValueError:  # a coding not read here, or not JSON
            return f"{name} answered 200 with a body that is not JSON"
        return body if isinstance(body, dict) else f"{name} answered JSON that is not an object"
    return f"{' and '.join(names)} answered {status}"


def redacted(value: Any, secrets: Sequence[str], name: str = "") -> Any:
    """``value`` with every field whose name says it is a secret (one named a token
    only where it is text), every flag's value in a
    command line whose flag says so, and every one of ``secrets`` found in a string,
    replaced by ``HIDDEN``."""
    if isinstance(value, dict):
        return {k: redacted(v, secrets, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redacted(v, secrets, name) for v in value]
    if value is not None and _SECRET_NAME.search(name):
        return HIDDEN
    if not isinstance(value, str):
        return value
    if _TOKEN_NAME.search(name):
        return HIDDEN
    text = _SECRET_FLAG.sub(lambda m: m.group(1) + HIDDEN, value)
    for secret in secrets:
        if text == secret or (len(secret) >= _SHORTEST_SEARCHED and secret in text):
            text = text.replace(secret, HIDDEN)
    return text
