"""Whether a backend may get traffic: a circuit breaker fed by its requests and health checks.

Like Envoy's outlier detection with its active health checks, and the circuit breaker of
SGLang's model gateway::

    closed --- eject_after_failures in a row ---> open (ejected: no traffic)
      ^                                             |
      |                                             | eject_seconds x ejections, capped
      |                                             v
      +--- readmit_after_successes --------- half-open (one trial at a time)
                                                    |
                     a failure: open again  <-------+

A request and a health check count alike. While open, nothing counts: the results still
coming in are of work sent before the ejection. Each ejection in a row lengthens the next
cool-down by ``eject_seconds`` up to ``eject_max_seconds``, and every ``eject_seconds``
spent closed forgives one, so a backend that keeps failing as soon as it is readmitted
gets less and less traffic, and one that failed once long ago starts afresh.

Pure: the time comes from an injected clock, and the caller counts and logs what changed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from specroute.router.protocol.outcome import Outcome


@dataclass(frozen=True)
class Ejection:
    """When a backend is ejected and for how long; ``RouterSettings.ejection()`` fills it."""

    after_failures: int = 3  # failures in a row that eject a backend
    seconds: float = 5.0  # the first cool-down; each ejection in a row adds as much
    max_seconds: float = 30.0  # the longest cool-down
    readmit_after_successes: int = 1  # successes in a row, half-open, that readmit it


class BreakerState(StrEnum):
    CLOSED = "closed"  # serving
    HALF_OPEN = "half_open"  # the cool-down is over: one trial at a time decides
    OPEN = "open"  # ejected: no traffic until the cool-down ends

    @property
    def level(self) -> int:
        """The value of ``specroute_backend_breaker_state``: the higher, the worse."""
        return _LEVELS[self]


_LEVELS = {BreakerState.CLOSED: 0, BreakerState.HALF_OPEN: 1, BreakerState.OPEN: 2}

# What a request's end says of its backend's health: True it served, False it failed,
# None nothing. The proxy judges a request once: a failure when the backend's failure is
# counted (by kind: connect, midstream, timeout), an answer when it was relayed whole.
_VERDICTS: dict[Outcome, bool | None] = {
    Outcome.ANSWERED: True,  # whatever its status: the backend chose it, and sent it whole
    Outcome.CONNECT: False,
    Outcome.MIDSTREAM: False,
    Outcome.TIMEOUT: False,
    # How the client saw a broken answer end; the failure that broke it (midstream or
    # timeout) is the one judged, so these are never judged a second time.
    Outcome.BROKEN: False,
    Outcome.TRUNCATED: False,
    # A 503 is SGLang's "queue full": backpressure from a backend alive enough to answer at
    # once, not ill health. Ejecting it would pour its load onto the other pool until that
    # one is full too; the request is retried on the other pool, and load-aware routing is
    # what steers the next ones away.
    Outcome.UNAVAILABLE: None,
    Outcome.CANCELLED: None,  # the client left
    Outcome.CUT_OFF: None,  # the router's drain timeout
    Outcome.OUT_OF_FDS: None,  # the router's own failures
    Outcome.INTERNAL: None,
}


def verdict(outcome: Outcome) -> bool | None:
    return _VERDICTS[outcome]


class Breaker:
    def __init__(self, rules: Ejection, clock: Callable[[], float] = time.monotonic) -> None:
        self.rules, self._clock = rules, clock
        self._state = BreakerState.CLOSED
        self._proven = False  # never seen working: its first failure ejects it
        self._failures = 0  # in a row, while closed
        self._successes = 0  # in a row, while half-open
        self._streak = 0  # ejections not yet forgiven
        self._max_streak = max(1, math.ceil(rules.max_seconds / rules.seconds))
        self._closed_at = clock()
        self._until = 0.0  # while open: the end of the cool-down
        self.cool_down = 0.0  # of the last ejection
        self.ejections = 0

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() >= self._until:
            self._state, self._successes = BreakerState.HALF_OPEN, 0
        return self._state

    def admits(self, *, busy: bool) -> bool:
        """May a request go to the backend now: closed, or half-open with nothing in flight
        there (``busy``), so that one request at a time is the trial. A health check is a
        trial too, and needs no admission."""
        state = self.state
        return state is BreakerState.CLOSED or (state is BreakerState.HALF_OPEN and not busy)

    def record(self, ok: bool) -> BreakerState | None:
        """One request's or health check's result; the state it moved the breaker to, if
        it moved it."""
        now, state = self._clock(), self.state
        if state is BreakerState.OPEN:
            return None
        if ok:
            self._proven = True
            self._failures = 0
            if state is BreakerState.HALF_OPEN:
                self._successes += 1
                if self._successes >= self.rules.readmit_after_successes:
                    self._state, self._closed_at = BreakerState.CLOSED, now
                    return BreakerState.CLOSED
            return None
        self._failures += 1
        if (
            state is BreakerState.HALF_OPEN
            or not self._proven
            or self._failures >= self.rules.after_failures
        ):
            self._eject(now, state)
            return BreakerState.OPEN
        return None

    def _eject(self, now: float, state: BreakerState) -> None:
        if state is BreakerState.CLOSED:
            forgiven = int((now - self._closed_at) / self.rules.seconds)
            self._streak = max(0, self._streak - forgiven)
        self._streak = min(self._streak + 1, self._max_streak)
        self.cool_down = min(self.rules.seconds * self._streak, self.rules.max_seconds)
        self._until = now + self.cool_down
        self._state, self._failures = BreakerState.OPEN, 0
        self.ejections += 1

    def describe(self) -> dict[str, Any]:
        state = self.state
        left = self._until - self._clock() if state is BreakerState.OPEN else None
        return {
            "state": str(state),
            "failures_in_a_row": self._failures,
            "ejections": self.ejections,
            "half_open_in": left,
        }
