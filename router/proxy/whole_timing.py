"""A whole answer a sample too. A whole (non-streamed) body arrives at once, after its
prefill, its queue and its decode: the router cannot time its decode from it. SGLang can:
a chat asked ``return_meta_info`` carries each choice's ``meta_info``, and with the server's
``--enable-metrics`` (which a server the router reads ``/metrics`` of has) its
``decode_throughput``, the request's output tokens after its first over the time from its
first token to its end (from the scheduler's prefill end, for a whole answer), and on a
speculative server its ``spec_accept_length``. So the router asks an SGLang server for it on
every whole chat whose client did not, and takes each choice's ``meta_info`` out of the
body the client gets, which is then the body the server writes without it, byte for byte
(SGLang writes a choice's ``meta_info`` last, and leaves it out where not asked).

It is not asked where asking changes more than that: a stream (SGLang refuses it there),
several choices (one decode time a sample), and what SGLang answers otherwise, or copies
into the ``meta_info`` too, once asked (logprobs, hidden states, routed experts, token
ids). A client that asked for ``meta_info`` itself gets it as the server sent it, and is
read as it passes."""

from __future__ import annotations

import re
from typing import Any, NamedTuple

import orjson

from specroute.router.protocol.json_object import with_last

PATH = "/v1/chat/completions"  # SGLang 0.5.23's completions take no return_meta_info
ASKED = "return_meta_info"
# what a client may ask that SGLang 0.5.23 then answers otherwise, or puts in each
# ``meta_info`` as well (its chat request model)
_OTHERWISE = frozenset(
    (
        "logprobs",
        "top_logprobs",
        "return_hidden_states",
        "return_routed_experts",
        "return_token_ids",
        "return_prompt_token_ids",
        "return_sampling_mask",
        "return_flat_raw_output_top_logprobs",
    )
)
_KEY = b'"meta_info"'
_OPENS = re.compile(rb"\s*:\s*\{")  # after the key: its value, an object
# a JSON string (escapes skipped) or a brace: what a value's end is found by
# (one not closed runs to the end: no scan begins again inside it)
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+(?:"|\Z)|[{}]', re.S)
_COLON = re.compile(rb"\s*:")
# what a decode can be: a token an hour to a million a second; a verify step's tokens
_SANE_THROUGHPUT, _SANE_ACCEPT = (1 / 3600, 1e6), 64.0


class Timing(NamedTuple):
    """What a whole answer's ``meta_info`` says of its decode."""

    tpot: float  # seconds per output token after its first
    accept_length: float | None  # its own, on a speculative server


def meta_info_asked(path: str, raw: bytes, body: dict[str, Any]) -> bytes | None:
    """The body to send for a whole chat whose client did not ask for its ``meta_info``:
    ``raw`` with ``return_meta_info`` given again last (a JSON reader keeps a name's last
    value); None where it is not to be asked (above), or ``raw`` is not plainly a UTF-8
    object with a member (``json_object.with_last``)."""
    if path != PATH or body.get("stream") not in (None, False):
        return None
    if body.get(ASKED) not in (None, False) or body.get("n") not in (None, 1):
        return None
    if not _OTHERWISE.isdisjoint(body) and any(
        body.get(name) not in (None, False) for name in _OTHERWISE
    ):
        return None
    return with_last(raw, b'"' + ASKED.encode() + b'":true')


def asked_meta_info(path: str, body: dict[str, Any]) -> bool:
    """Whether a whole chat of one choice asked for its ``meta_info`` itself: read as it
    passes."""
    whole = path == PATH and body.get("stream") in (None, False)
    return whole and body.get(ASKED) is True and body.get("n") in (None, 1)


class Whole(NamedTuple):
    """A whole answer as read (``read_whole``)."""

    sent: bytes | None  # as the client gets it; None: a meta_info not taken out (not JSON)
    timing: Timing | None  # its one ``meta_info``'s decode, where it gives one
    tokens: int | None  # its output tokens, where it says


def read_whole(answer: bytes, take_out: bool) -> Whole:
    """``answer`` read once (orjson): its one choice's ``meta_info``'s decode (none where
    several), its output tokens, and, where ``take_out``, the answer less each
    ``meta_info`` member (and the comma before it), found in the bytes as orjson writes it
    or else by a scan of its braces."""
    try:
        data = orjson.loads(answer)
    except orjson.JSONDecodeError:
        data = None
    infos = _infos(data)
    timing = _timing(infos[0]) if len(infos) == 1 else None
    sent = _without(answer, infos) if take_out else answer
    return Whole(sent, timing, _tokens(data))


def _infos(data: object) -> list[dict[str, Any]]:
    """Each choice's ``meta_info`` of a chat's answer."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        return []
    found = [c.get("meta_info") for c in choices if isinstance(c, dict)]
    return [info for info in found if isinstance(info, dict)]


def _timing(info: dict[str, Any]) -> Timing | None:
    throughput = _number(info.get("decode_throughput"))
    if throughput is None or not _SANE_THROUGHPUT[0] <= throughput <= _SANE_THROUGHPUT[1]:
        return None
    accept = _number(info.get("spec_accept_length"))
    sane = accept is not None and 1 <= accept <= _SANE_ACCEPT
    return Timing(1.0 / throughput, accept if sane else None)


def _tokens(data: object) -> int | None:
    """The output tokens its ``usage`` gives."""
    usage = data.get("usage") if isinstance(data, dict) else None
    found = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return found if isinstance(found, int) and not isinstance(found, bool) else None


def _number(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _without(answer: bytes, infos: list[dict[str, Any]]) -> bytes | None:
    """``answer`` less each ``meta_info`` member; None where one does not end, is not an
    object, or has no member before it (SGLang's is a choice's last). A key's quotes are
    never inside a string, where they would be escaped, and a key is followed by a colon,
    which a string value never is."""
    packed = [orjson.dumps(info) for info in infos]
    kept, at = [], 0
    for i, found in enumerate(_keys(answer, _KEY)):
        if found < at:
            return None  # inside one taken out
        start = len(answer[:found].rstrip())
        value = _OPENS.match(answer, found + len(_KEY))
        if answer[start - 1 : start] != b"," or value is None:
            return None
        begins = value.end() - 1
        if i < len(packed) and answer.startswith(packed[i], begins):
            end: int | None = begins + len(packed[i])  # as orjson writes it: no scan
        else:
            end = _value_end(answer, begins)
        if end is None:
            return None
        kept.append(answer[at : start - 1])
        at = end
    if not kept:
        return answer
    kept.append(answer[at:])
    return b"".join(kept)


def _keys(answer: bytes, key: bytes) -> list[int]:
    """Where ``key`` is a key of an object in ``answer`` (followed by a colon)."""
    found, at = [], answer.find(key)
    while at >= 0:
        if _COLON.match(answer, at + len(key)):
            found.append(at)
        at = answer.find(key, at + len(key))
    return found


def _value_end(data: bytes, start: int) -> int | None:
    """Where the object at ``start`` ends (past its closing brace), strings skipped."""
    depth = 0
    for token in _TOKEN.finditer(data, start):
        if token.group() == b"{":
            depth += 1
        elif token.group() == b"}":
            depth -= 1
            if depth == 0:
                return token.end()
    return None
