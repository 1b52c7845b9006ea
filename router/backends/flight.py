"""One request at one backend, from dispatch to the end of its answer."""

from __future__ import annotations

import re
import time

from specroute.online.estimator import Lived
from specroute.online.samples import Reading
from specroute.router.backends.backend import Backend
from specroute.router.metrics import RouterMetrics
from specroute.router.protocol.outcome import Outcome

Tail = tuple[bytes, bytes]  # the answer's last two chunks relayed, the last one last
_USAGE = re.compile(
    rb'"(prompt_tokens|completion_tokens|input_tokens|output_tokens)"\s*:\s*(\d{1,12})(?!\d)'
)
_NAMES = {  # the Responses API's names for them
    "input_tokens": "prompt_tokens",
    "output_tokens": "completion_tokens",
    "prompt_tokens": "prompt_tokens",
    "completion_tokens": "completion_tokens",
}
_SEARCHED = 4096  # bytes of each of the last two chunks searched for a usage


class Flight:
    """One request at one backend, from dispatch to the end of its answer: in flight all
    along (in this worker's slot of the board, with its estimated context in KV tokens),
    then counted once by its outcome. One the backend failed before its first byte is not
    counted here (the backend's error is, by kind): another may still serve it."""

    def __init__(
        self,
        metrics: RouterMetrics,
        backend: Backend,
        stream: bool,
        context: int,
        lived: Lived | None = None,
        joined: int = 0,
        prompt: int = 0,
    ) -> None:
        """``context``, ``prompt``: its estimated KV tokens while decoding and its prompt's
        tokens. ``lived``: the load its samples count, integrated over time up to a moment,
        and the prompts sent beside it (``Online.lived``); read at its first byte, so that
        the load it decoded under is known at its end. ``joined``: the load it joined,
        itself included (``Online.joined``)."""
        self.metrics, self.backend, self.stream, self.context = metrics, backend, stream, context
        self.lived, self.joined = lived, joined
        # ``lived`` at its first byte (a stream's), and when that was
        self.lived_first: Reading | None = None
        self.lived_at = 0.0
        self.started = time.monotonic()
        self.outcome: Outcome | None = None
        self.status = 0  # the backend's HTTP status: the label of an answered request
        # what its server's breaker is told of it when it lands (``Verdicts.request_ended``):
        # its failure's kind where one was found, answered, or nothing (a client gone)
        self.verdict: Outcome | None = None
        self.delivered = False  # the answer's last byte reached the client: whole, come what may
        self.first_at: float | None = None  # when its first byte came
        # the answer's last two chunks relayed: where its usage is, if it gives one (a
        # stream's usage event may come apart from its [DONE])
        self.tail: Tail = (b"", b"")
        # the router asked for the stream's usage, which the client did not: its event is
        # read for the sample and taken out of what the client gets (``stream_usage``)
        self.usage_added = False
        # and for its speculation details (a speculative SGLang server), taken out likewise
        self.details_added = False
        # the stream's speculation details are read as they pass (asked by the router or by
        # the client): the request's own accept length, once they came
        self.reads_details = False
        self.accept_length: float | None = None
        # a whole answer's ``meta_info``: asked by the router (taken out of what the client
        # gets) or by the client; read for its decode time (``whole_timing``), its sample's
        # load counted from its dispatch (``decoding_from_dispatch``)
        self.meta_added = False
        self.reads_meta = False
        self.tpot: float | None = None  # its decode's time per output token, so read
        # a stream's silence, as the watchdog (``silence``) sees it
        self.reading = False  # the relay waits for the backend (not for a slow client)
        self.received = 0  # the answer's bytes at the watchdog's last look
        self.quiet_since = self.started
        backend.dispatched(1, context, prompt)

    def decoding_from_dispatch(self) -> None:
        """A whole answer's sample counts the load from its dispatch (``now``): its decode
        has no moment the router sees it begin."""
        if self.lived is not None:
            self.lived_at = time.monotonic()
            self.lived_first = self.lived(self.lived_at)

    def first_byte(self) -> None:
        m = self.metrics
        self.first_at = time.monotonic()
        if self.lived is not None and self.stream:  # a whole answer's: at its dispatch
            self.lived_at, self.lived_first = self.first_at, self.lived(self.first_at)
        m.child(m.ttft, self.backend.pool).observe(self.first_at - self.started)

    def land(self) -> None:
        m, backend = self.metrics, self.backend
        backend.dispatched(-1, -self.context)  # what it added, whatever the profile now
        if self.outcome is None:
            return
        status = str(self.status) if self.outcome is Outcome.ANSWERED else self.outcome
        m.child(m.requests, backend.pool, backend.name, status).inc()
        m.child(m.duration, backend.pool).observe(time.monotonic() - self.started)
        if self.outcome in (Outcome.OUT_OF_FDS, Outcome.INTERNAL):
            m.child(m.router_errors, self.outcome).inc()


def usage(tail: Tail) -> dict[str, int]:
    """The token counts an answer's end gives, by name (``prompt_tokens``,
    ``completion_tokens``; only those it gives): a whole body's ``usage``, a stream's last
    event when the client asked for it (``stream_options.include_usage``; it may come apart
    from its ``[DONE]``, hence two chunks), ``/generate``'s ``meta_info``, the Responses
    API's ``input_tokens`` and ``output_tokens`` (its last event, ``response.completed`` or
    ``response.incomplete``).
    The last of each counts (a stream's running count); a ``null`` or a number past 12
    digits is none."""
    before, last = tail
    found: dict[str, int] = {}
    for name, value in _USAGE.findall(before[-_SEARCHED:] + last[-_SEARCHED:]):
        found[_NAMES[name.decode()]] = int(value)
    return found
