"""Each request's id: the client's (``x-request-id``, or the first of the headers named in
``request_id_headers`` that it sent) or one made here. It goes upstream as
``x-request-id`` (and as SGLang's ``rid`` on a ``/generate`` body that has none), comes
back in the answer's headers, and is in every log line and error answer about the request.

While a request is handled its id is the context's (``current()``): a log record made
then carries it, and an error answer built then names it."""

from __future__ import annotations

import json
import logging
import os
import re
from contextvars import ContextVar, Token

from specroute.router.protocol.asked import Asked

HEADER = "x-request-id"  # what the router sends upstream, and answers with
_CURRENT: ContextVar[str | None] = ContextVar("specroute_request_id", default=None)
_ACCEPTED = re.compile(r"[A-Za-z0-9._:/+=@-]{1,128}")  # no spaces, quotes nor controls


def current() -> str | None:
    """The id of the request being handled in this context, if any."""
    return _CURRENT.get()


def given_or_made(request: Asked, names: list[str]) -> tuple[str, str]:
    """The request's id and the header it is answered in: the first of ``names`` the
    client sent with an id that can be logged as it is, or a new one. A value that could
    not (too long, spaces, controls) is replaced, not refused: an id is for following a
    request, never for deciding anything."""
    for name in names:
        value = request.headers.get(name)
        if value is not None and _ACCEPTED.fullmatch(value):
            return value, name
    return _made(), names[0] if names else HEADER


def _made() -> str:
    """A new id: 32 random hex digits, as a uuid4's without building one (a third of its
    cost). Random, not counted: it becomes a ``/generate`` request's ``rid``, by which
    SGLang aborts a request, so another client must not be able to guess it."""
    return os.urandom(16).hex()


def enter(request_id: str) -> Token[str | None]:
    """Make ``request_id`` the context's; the token ``leave`` takes."""
    return _CURRENT.set(request_id)


def leave(token: Token[str | None]) -> None:
    _CURRENT.reset(token)


def with_rid(raw: bytes, rid: str) -> bytes:
    """A JSON object's bytes with ``"rid"`` put first, the rest as it came (SGLang's extra
    fields, the client's formatting); ``raw`` itself if it is not plainly a UTF-8 object."""
    start = raw.lstrip()
    if not start.startswith(b"{") or b"\x00" in raw:  # UTF-16 has NULs: left alone
        return raw
    rest = start[1:].lstrip()
    field = b'"rid":' + json.dumps(rid).encode()
    return b"{" + field + (b"" if rest.startswith(b"}") else b",") + rest


class Tagged(logging.Filter):
    """Adds the request's id to a record made while a request is handled: as the
    record's ``request_id`` (a structured log's field) and at the end of its message."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = _CURRENT.get()
        if rid is not None and not hasattr(record, "request_id"):
            record.request_id = rid
            record.msg, record.args = f"{record.getMessage()} [request {rid}]", None
        return True
