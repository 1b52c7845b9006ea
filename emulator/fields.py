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


def stop_strings(stop: Any, field: str) -> tuple[str, ...]:
    """A string or a list of strings, empty ones dropped; a 400 naming ``field`` otherwise."""
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop):
        return tuple(s for s in stop if s)
    raise BadRequest(f"{field} must be a string or a list of strings.")
