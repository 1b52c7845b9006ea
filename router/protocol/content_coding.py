"""A body as sent with its ``Content-Encoding`` (RFC 9110 8.4), decoded: gzip and deflate,
the codings a metrics endpoint uses (SGLang's compresses ``/metrics`` with gzip for a
client that accepts it). The router's session leaves every body as sent, for its proxy
relays them so: what the router reads itself, it decodes here."""

from __future__ import annotations

import zlib

import aiohttp

_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def decoded(body: bytes, coding: str) -> bytes:
    """``body`` with every coding in ``coding`` undone, the last applied first; ValueError
    for a coding not known here or a body it does not decode."""
    for name in reversed([c.strip().lower() for c in coding.split(",") if c.strip()]):
        if name == "identity":
            continue
        if name not in _WBITS:
            raise ValueError(f"content coding {name!r} is not read here")
        try:
            body = zlib.decompress(body, _WBITS[name])
        except zlib.error as exc:
            raise ValueError(f"a body said to be {name} does not decode: {exc}") from None
    return body


async def read_decoded(response: aiohttp.ClientResponse) -> bytes:
    """``response``'s body as its server meant it; ValueError where it does not decode."""
    return decoded(await response.read(), response.headers.get("Content-Encoding", "identity"))
