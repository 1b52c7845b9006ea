"""SGLang's error shapes: ``ErrorResponse`` bodies, and ``data: {"error": ...}`` in streams."""

from __future__ import annotations

import json
from http import HTTPStatus
from typing import Any

import orjson
from aiohttp import web


class BadRequest(Exception):
    """A request the server refuses, with the status and the message the client sees."""

    def __init__(self, message: str, status: int = 400, err_type: str = "BadRequestError") -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type


def error_body(message: str, status: int, err_type: str) -> dict[str, Any]:
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def error_response(error: BadRequest) -> web.Response:
    return web.json_response(
        error_body(error.message, error.status, error.err_type), status=error.status
    )


def sse_event(payload: dict[str, Any]) -> bytes:
    """One server-sent event, as SGLang writes it: orjson's (compact, UTF-8 unescaped)."""
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def stream_error_event(message: str, status: int) -> bytes:
    body = error_body(message, status, HTTPStatus(status).name)
    return b"data: " + json.dumps({"error": body}).encode() + b"\n\n"


async def read_json(request: web.Request) -> dict[str, Any]:
    """The body as a JSON object, or a 400 naming what is wrong with it."""
    if request.content_type != "application/json":
        raise BadRequest(
            "Unsupported Media Type: Only 'application/json' is allowed, "
            f"got {request.content_type!r}"
        )
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"JSON decode error: {exc}") from None
    if not isinstance(body, dict):
        raise BadRequest("The request body must be a JSON object.")
    return body
