"""Every stream a sample. Online calibration learns from a stream's token count, which only
its usage event gives, and most clients do not ask for it (the ``openai`` client's plain
``stream=True`` does not). So the router asks the server for the usage of every streamed
chat and completion whose client did not (``stream_options.include_usage``, the client's
other stream options kept) and takes the usage event out of the stream the client gets,
which is then the stream it asked for, byte for byte: SGLang writes every other event the
same either way, and the usage one apart, with no choices."""

from __future__ import annotations

import json
import re
from typing import Any

PATHS = ("/v1/chat/completions", "/v1/completions")
_OPTIONS = "stream_options"
# the event the server adds: no choices, a usage (SGLang's ``choices=[]`` usage chunk)
_USAGE_EVENT = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_EVENTS = re.compile(rb"(?<=\n\n)|(?<=\r\n\r\n)")  # after each event's blank line


def asked_for(path: str, raw: bytes, body: dict[str, Any]) -> bytes | None:
    """The body to send for a stream whose client did not ask for its usage: ``raw`` with
    ``stream_options`` given again last (a JSON reader keeps a name's last value), the
    client's options and ``include_usage``. None where nothing is to be added, or ``raw``
    is not plainly a UTF-8 object."""
    if path not in PATHS or body.get("stream") is not True:
        return None
    options = body.get(_OPTIONS)
    if options is not None and not isinstance(options, dict):
        return None  # the server refuses it: its answer is the client's to read
    if options is not None and options.get("include_usage") is True:
        return None
    end = raw.rstrip()
    if not end.endswith(b"}") or b"\x00" in raw:  # UTF-16 has NULs: left alone
        return None
    merged = json.dumps({**(options or {}), "include_usage": True}, separators=(",", ":"))
    return end[:-1] + b',"' + _OPTIONS.encode() + b'":' + merged.encode() + b"}"


def has_usage(chunk: bytes) -> bool:
    """Whether ``chunk`` may hold the usage event, which the relay must take out."""
    return _USAGE.search(chunk) is not None


def without_usage(events: bytes) -> bytes:
    """Whole events less the usage event (the one with a usage and no choices); ``events``
    itself where none has a usage."""
    if not has_usage(events):
        return events
    parts = _EVENTS.split(events)
    return b"".join(p for p in parts if not (_USAGE.search(p) and _USAGE_EVENT.search(p)))
