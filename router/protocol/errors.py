"""OpenAI-shaped errors, as a response before any byte was sent, or as an SSE event after."""

from __future__ import annotations

import json

from aiohttp import web
from pydantic import BaseModel

from specroute.router.protocol.request_id import current


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None
    code: int | str  # OpenAI's name for the error where it has one, else the HTTP status
    request_id: str | None = None  # the request's, when the error came while handling one


class Error(BaseModel):
    """Every error the router answers itself, OpenAI's shape."""

    error: ErrorDetail


def error_json(
    message: str, err_type: str, code: int | str, param: str | None = None
) -> dict[str, object]:
    """OpenAI's shape; made while a request is handled, it names the request's id too."""
    detail = ErrorDetail(message=message, type=err_type, param=param, code=code)
    if (rid := current()) is not None:
        detail.request_id = rid
    return Error(error=detail).model_dump(exclude_unset=True)


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
