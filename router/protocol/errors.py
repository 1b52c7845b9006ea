"""OpenAI-shaped errors, as a response before any byte was sent, or as an SSE event after."""

from __future__ import annotations

import json

from aiohttp import web

from specroute.router.protocol.request_id import current


def error_json(
    message: str, err_type: str, code: int | str, param: str | None = None
) -> dict[str, object]:
    """OpenAI's shape; made while a request is handled, it names the request's id too."""
    error: dict[str, object] = {"message": message, "type": err_type, "param": param, "code": code}
    rid = current()
    if rid is not None:
        error["request_id"] = rid
    return {"error": error}


def error_response(
    status: int,
    message: str,
    err_type: str = "invalid_request_error",
    retry_after: float | None = None,
    *,
    param: str | None = None,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """``retry_after``: seconds after which the same request may succeed (a 503's header);
    ``code``: OpenAI's name for the error, if it has one (else the status)."""
    headers = dict(headers or {})
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, round(retry_after)))
    body = error_json(message, err_type, status if code is None else code, param)
    return web.json_response(body, status=status, headers=headers)


def sse_error(message: str, err_type: str = "upstream_error", code: int = 502) -> bytes:
    return (
        b"data: "
        + json.dumps(error_json(message, err_type, code)).encode()
        + b"\n\ndata: [DONE]\n\n"
    )
