"""How a proxied request ended: one short name that says which side failed and how.

Like Envoy's response flags, the names are a fixed vocabulary that the proxy, the
metrics and the tests share. The first group ends a request at its backend, and is the
``status`` label of ``specroute_requests_total`` (an answer relayed to its end shows its
HTTP status instead). The second is the backend failing, the ``kind`` label of
``specroute_upstream_errors_total``; those that provably left no work running at the
backend before any byte reached the client may go to another backend, once. The router's
own failures are neither the client's nor a backend's, and are charged to no backend.
"""

from __future__ import annotations

import errno
from enum import StrEnum


class Outcome(StrEnum):
    ANSWERED = "answered"  # the backend's answer, relayed to its end
    BROKEN = "broken"  # the backend failed mid-stream; the stream ends with an error event
    TRUNCATED = "truncated"  # a non-streamed body broke; the connection is cut, not ended
    CUT_OFF = "cut_off"  # the drain timeout closed it
    CANCELLED = "cancelled"  # the client went away
    # the backend's failures
    CONNECT = "connect"  # no connection could be made, or it closed before an answer
    UNAVAILABLE = "unavailable"  # the backend answered 503
    MIDSTREAM = "midstream"  # the answer broke (before the first byte: retried; after: BROKEN)
    TIMEOUT = "timeout"  # silent past idle_timeout or request_timeout: may still be working
    # the router's own
    OUT_OF_FDS = "out_of_fds"  # the router had no file descriptor left for the upstream
    INTERNAL = "internal_error"  # an exception the router did not expect

    @property
    def retryable(self) -> bool:
        """The backend failed, no work of this request is left running there, and nothing
        reached the client: another backend may serve it."""
        return self in (Outcome.CONNECT, Outcome.UNAVAILABLE, Outcome.MIDSTREAM)


def out_of_fds(exc: BaseException) -> bool:
    """Whether a socket could not be opened because the router has no file descriptor left
    (aiohttp wraps the OSError and keeps its errno): the router's failure, no backend's."""
    return getattr(exc, "errno", None) in (errno.EMFILE, errno.ENFILE)
