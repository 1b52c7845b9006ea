"""How far an emulated server fell behind its time scale during a run: its engine's
intended and actual step time (``specroute_emulator_step_{intended,actual}_seconds_total``)
read before and after. A run whose server lagged measured the machine, not the model.
A real engine exports neither, and has no time scale to keep.

The servers' requests' own times (``sglang:e2e_request_latency_seconds``) are read with
them: beside the time a request's client timed, they say what share of it went elsewhere
than in the servers (the router's, the client's, the wire's). At a time scale each wall
millisecond of that is many emulated ones, so a run whose router and client took much of a
request's time did not keep it either, whatever its servers did."""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import aiohttp

from specroute import prometheus

# actual over intended step time, minus one, and a request's share of its time elsewhere
# than in the servers: past either a run does not count
LIMIT = 0.05
_INTENDED = "specroute_emulator_step_intended_seconds_total"
_ACTUAL = "specroute_emulator_step_actual_seconds_total"
_SERVED = "sglang:e2e_request_latency_seconds_sum"
_REQUESTS = "sglang:e2e_request_latency_seconds_count"


class Clock(NamedTuple):
    intended: float
    actual: float
    served: float = 0.0  # wall seconds, its finished requests' times summed
    requests: float = 0.0  # its finished requests


CONCLUDED_NOTHING = "nothing is concluded from it"  # what a LagError's message says


class LagError(RuntimeError):
    """A run whose emulated server could not keep its time, again after a retry."""


async def clock(session: aiohttp.ClientSession, url: str) -> Clock | None:
    """The server's step-time counters, or None where it has none (a real engine)."""
    try:
        async with session.get(f"{url}/metrics") as r:
            text = await r.text() if r.status == 200 else ""
    except (aiohttp.ClientError, TimeoutError):
        return None
    found = prometheus.sums(text, {_INTENDED, _ACTUAL, _SERVED, _REQUESTS})
    if _INTENDED not in found or _ACTUAL not in found:
        return None
    return Clock(
        found[_INTENDED], found[_ACTUAL], found.get(_SERVED, 0.0), found.get(_REQUESTS, 0.0)
    )


def lag(before: Clock | None, after: Clock | None) -> float | None:
    """Actual over intended step time between two readings, minus one; None without both
    or without a step between them."""
    if before is None or after is None:
        return None
    intended = after.intended - before.intended
    return (after.actual - before.actual) / intended - 1.0 if intended > 0 else None


async def clocks(session: aiohttp.ClientSession, urls: list[str]) -> list[Clock | None]:
    """Each server's clock, in the order given."""
    return list(await asyncio.gather(*(clock(session, url) for url in urls)))


def overall(before: list[Clock | None], after: list[Clock | None]) -> float | None:
    """How far the servers together lagged between two readings of all of them: their
    actual over intended step time, summed, minus one. Each weighs by the steps it was meant
    to take, so a server that stepped a few times (an idle one woken by a probe) cannot
    stand for one that served the run; None where none could say."""
    pairs = [(b, a) for b, a in zip(before, after, strict=True) if b is not None and a is not None]
    intended = sum(a.intended - b.intended for b, a in pairs)
    actual = sum(a.actual - b.actual for b, a in pairs)
    return actual / intended - 1.0 if intended > 0 else None


def elsewhere(
    before: list[Clock | None], after: list[Clock | None], timed: float, time_scale: float
) -> float | None:
    """The share of a request's mean time as its client timed it (``timed``, emulated
    seconds) spent elsewhere than in the servers between two readings of all of them; None
    where none could say (no request finished, or none timed)."""
    pairs = [(b, a) for b, a in zip(before, after, strict=True) if b is not None and a is not None]
    requests = sum(a.requests - b.requests for b, a in pairs)
    if requests <= 0 or timed <= 0:
        return None
    served = sum(a.served - b.served for b, a in pairs) / requests / time_scale
    return max(0.0, 1.0 - served / timed)


class Kept(NamedTuple):
    """How a live run kept its time: its servers' lag (``overall``) and the share of a
    request's time its router and client took (``elsewhere``); None: unknown."""

    lag: float | None
    elsewhere: float | None = None

    @property
    def kept(self) -> bool:
        return not any(v is not None and v > LIMIT for v in self)

    def said(self) -> str:
        """What a run that did not keep its time says of itself ("" where it did)."""
        if self.lag is not None and self.lag > LIMIT:
            return late(self.lag)
        if self.elsewhere is not None and self.elsewhere > LIMIT:
            return (
                f"the router and the client took {self.elsewhere:.0%} of a request's time "
                f"(limit {LIMIT:.0%}; each of their wall milliseconds is many emulated ones "
                "at a time scale): conclude nothing from it"
            )
        return ""


def shown(behind: float | None) -> str:
    """A lag as a table shows it: a signed percentage, 0.0% for a lag that rounds to none
    either way, and - where none could be read."""
    if behind is None:
        return "-"
    said = f"{behind:+.1%}"
    return "0.0%" if said in ("+0.0%", "-0.0%") else said


def late(behind: float) -> str:
    """What a run that lagged ``behind`` says of itself."""
    return (
        f"the emulators ran {behind:.0%} behind their time scale (limit {LIMIT:.0%}): "
        "this run measured the machine, not the model; conclude nothing from it"
    )
