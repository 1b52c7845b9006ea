"""How a proxied request ended: one short name that says which side failed and how.

Like Envoy's response flags, the names are a fixed vocabulary that the proxy, the
metrics and the tests share. The first five end a request whose answer the client got,
whole or not, and are the ``status`` label of ``specroute_requests_total`` (an answer
relayed to its end shows its HTTP status instead). The last three are the backend failing
before any byte reached the client, the ``kind`` label of
``specroute_upstream_errors_total``: such a request may go to another backend, once, and
is answered 502 when that fails too.
"""

from __future__ import annotations

from enum import StrEnum


class Outcome(StrEnum):
    ANSWERED = "answered"  # the backend's answer, relayed to its end
    BROKEN = "broken"  # the backend failed mid-stream; the stream ends with an error event
    TRUNCATED = "truncated"  # a non-streamed body broke; the connection is cut, not ended
    CUT_OFF = "cut_off"  # the drain timeout closed it
    CANCELLED = "cancelled"  # the client went away
    CONNECT = "connect"  # no connection, or no answer within the timeouts
    UNAVAILABLE = "unavailable"  # the backend answered 503
    MIDSTREAM = "midstream"  # the answer broke (before the first byte: retried; after: BROKEN)

    @property
    def retryable(self) -> bool:
        """The backend failed and nothing reached the client: another backend may serve."""
        return self in (Outcome.CONNECT, Outcome.UNAVAILABLE, Outcome.MIDSTREAM)
