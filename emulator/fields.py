"""Request fields that SGLang's native and OpenAI-compatible APIs read alike."""

from __future__ import annotations

import uuid
from typing import Any

from specroute.emulator.errors import BadRequest


def request_id(body: dict[str, Any]) -> str:
    """The client's ``rid`` (SGLang's field, used to abort by name), or a fresh one."""
    rid = body.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise BadRequest("Field 'rid' must be a string.")
    return rid or uuid.uuid4().hex


def whole_number(value: Any) -> int | None:
    """An integer as SGLang's pydantic models read one (lax mode): an int, or a float
    with no fractional part (``5.0``); None for anything else (``5.5``, ``true``)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def stop_strings(stop: Any, field: str) -> tuple[str, ...]:
    """A string or a list of strings, empty ones dropped; a 400 naming ``field`` otherwise."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return tuple(s for s in stop if s)
    raise BadRequest(f"{field} must be a string or a list of strings.")
