"""OpenAI-shaped errors, as a response before any byte was sent, or as an SSE event after."""

from __future__ import annotations

import json

from aiohttp import web


def error_json(message: str, err_type: str, code: int | str) -> dict[str, object]:
    return {"error": {"message": message, "type": err_type, "param": None, "code": code}}


def error_response(
    status: int,
    message: str,
    err_type: str = "invalid_request_error",
    retry_after: float | None = None,
) -> web.Response:
    """``retry_after``: seconds after which the same request may succeed (a 503's header)."""
    headers = None if retry_after is None else {"Retry-After": str(max(1, round(retry_after)))}
    return web.json_response(error_json(message, err_type, status), status=status, headers=headers)


def sse_error(message: str, err_type: str = "upstream_error", code: int = 502) -> bytes:
    return (
        b"data: "
        + json.dumps(error_json(message, err_type, code)).encode()
        + b"\n\ndata: [DONE]\n\n"
    )
