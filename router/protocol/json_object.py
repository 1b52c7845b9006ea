"""A request's JSON object as its bytes came, with members the router adds."""

from __future__ import annotations


def with_last(raw: bytes, members: bytes) -> bytes | None:
    """``raw``, a JSON object's bytes, with ``members`` (``"name":value``, comma-separated)
    put last, the rest as it came: a JSON reader keeps a name's last value. None where
    ``raw`` is not plainly a UTF-8 object (UTF-16 has NULs) or has no member to put them
    after."""
    end = raw.rstrip()
    if not end.endswith(b"}") or b"\x00" in raw or end[:-1].rstrip().endswith(b"{"):
        return None
    return end[:-1] + b"," + members + b"}"
