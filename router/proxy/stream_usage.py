"""Every stream a sample. Online calibration learns from a stream's token count, which only
its usage event gives, and most clients do not ask for it (the ``openai`` client's plain
``stream=True`` does not). So the router asks the server for the usage of every streamed
chat and completion whose client did not (``stream_options.include_usage``, the client's
other stream options kept) and takes the usage event out of the stream the client gets,
which is then the stream it asked for, byte for byte: SGLang writes every other event the
same either way, and the usage one apart, with no choices.

A speculative SGLang server is asked the same way for the request's own speculation
details (``return_spec_tokens_details``: its accept length, where the server's gauge gives
every request's at once), which SGLang sends as an event of their own before the usage
(``choices: []``, ``sglext.spec_tokens_details``); the relay takes that event out too, or
only those details where the server put more in it (``--return-input-ids``: its ids). A
client that asked for an ``sglext`` field itself is not asked for more: its event is its
own, and read as it passes."""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

import orjson

from specroute.router.protocol.json_object import with_last

PATHS = ("/v1/chat/completions", "/v1/completions")
_OPTIONS = "stream_options"
DETAILS = "return_spec_tokens_details"
# what a client asks that puts an ``sglext`` in SGLang 0.5.23's answer (its request models)
_SGLEXT = (
    DETAILS,
    "return_cached_tokens_details",
    "return_routed_experts",
    "return_input_ids_in_sglext",
    "return_output_ids_in_sglext",
)
# an event the server adds has no choices (SGLang's ``choices=[]`` usage and sglext chunks)
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_USAGE = re.compile(rb'"usage"\s*:\s*\{')
_DETAILS = re.compile(rb'"spec_tokens_details"\s*:\s*\{')
# what may be added, at usage + 2 x details (whether each was): one search a chunk
_ADDED = (None, _USAGE, _DETAILS, re.compile(rb'"(?:usage|spec_tokens_details)"\s*:\s*\{'))
_ACCEPT = re.compile(rb'"spec_accept_length"\s*:\s*(-?[0-9][0-9.eE+-]*)')
_EVENTS = re.compile(rb"(?<=\n\n)|(?<=\r\n\r\n)")  # after each event's blank line
_DATA = re.compile(rb"^(data:\s?)(.*?)(\r?\n\r?\n)$", re.S)


class Asked(NamedTuple):
    """The body sent instead of the client's, and what it adds."""

    raw: bytes
    usage: bool  # ``stream_options.include_usage``
    details: bool  # ``return_spec_tokens_details``


def asked_for(path: str, raw: bytes, body: dict[str, Any], details: bool = False) -> Asked | None:
    """The body to send for a stream whose client did not ask for its usage (or, where
    ``details``, the server offers them, for its speculation details): ``raw`` with
    ``stream_options`` given again last (a JSON reader keeps a name's last value), the
    client's options and ``include_usage``, and ``return_spec_tokens_details``. None where
    nothing is to be added, or ``raw`` is not plainly a UTF-8 object."""
    if path not in PATHS or body.get("stream") is not True:
        return None
    options = body.get(_OPTIONS)
    if options is not None and not isinstance(options, dict):
        return None  # the server refuses it: its answer is the client's to read
    # not asked: absent, null or false (0 too, as the server's bool reads it); any other
    # value is the client's to have read (1 and "true" ask for it)
    usage = options is None or options.get("include_usage") in (None, False)
    details = details and not any(body.get(name) for name in _SGLEXT)
    added = []
    if usage:
        merged = json.dumps({**(options or {}), "include_usage": True}, separators=(",", ":"))
        added.append(b'"' + _OPTIONS.encode() + b'":' + merged.encode())
    if details:
        added.append(b'"' + DETAILS.encode() + b'":true')
    sent = with_last(raw, b",".join(added)) if added else None
    return None if sent is None else Asked(sent, usage, details)


def has_added(chunk: bytes, usage: bool, details: bool) -> bool:
    """Whether ``chunk`` may hold an event the relay must take out: the usage one where it
    was added, the speculation details where they were."""
    added = _ADDED[usage + 2 * details]
    return added is not None and added.search(chunk) is not None


def without_added(events: bytes, usage: bool, details: bool) -> bytes:
    """Whole events less those the router asked for: the usage event (a usage and no
    choices) where ``usage``, the speculation details where ``details`` (their event, or
    the details alone where it holds more); ``events`` itself where none is there."""
    if not has_added(events, usage, details):
        return events
    kept = []
    for part in _EVENTS.split(events):
        if usage and _USAGE.search(part) and _NO_CHOICES.search(part):
            continue
        if details and _DETAILS.search(part) and _NO_CHOICES.search(part):
            part = _less_details(part)
        kept.append(part)
    return b"".join(kept)


def accept_length(chunk: bytes) -> float | None:
    """The request's own accept length in ``chunk``'s speculation details, if there."""
    found = _ACCEPT.search(chunk) if _DETAILS.search(chunk) else None
    if found is None:
        return None
    try:
        value = float(found.group(1))
    except ValueError:
        return None
    return value if value >= 1 else None  # a bonus token a verify step at the least


def _less_details(event: bytes) -> bytes:
    """``event`` without ``sglext.spec_tokens_details``: nothing where that was all of its
    ``sglext``; else the event written again without them."""
    found = _DATA.match(event)
    if found is None:
        return event
    try:
        data = orjson.loads(found.group(2))
    except orjson.JSONDecodeError:
        return event
    sglext = data.get("sglext") if isinstance(data, dict) else None
    if not isinstance(sglext, dict) or "spec_tokens_details" not in sglext:
        return event
    del sglext["spec_tokens_details"]
    if not any(v is not None for v in sglext.values()):
        return b""
    return found.group(1) + orjson.dumps(data) + found.group(3)
