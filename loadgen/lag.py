"""How far an emulated server fell behind its time scale during a run: its engine's
intended and actual step time (``specroute_emulator_step_{intended,actual}_seconds_total``)
read before and after. A run whose server lagged measured the machine, not the model.
A real engine exports neither, and has no time scale to keep."""

from __future__ import annotations

import asyncio
from typing import NamedTuple

import aiohttp

from specroute import prometheus

LIMIT = 0.05  # actual over intended step time, minus one, past which a run does not count
_INTENDED = "specroute_emulator_step_intended_seconds_total"
_ACTUAL = "specroute_emulator_step_actual_seconds_total"


class Clock(NamedTuple):
    intended: float
    actual: float


class LagError(RuntimeError):
    """A run whose emulated server could not keep its time, again after a retry."""


async def clock(session: aiohttp.ClientSession, url: str) -> Clock | None:
    """The server's step-time counters, or None where it has none (a real engine)."""
    try:
        async with session.get(f"{url}/metrics") as r:
            text = await r.text() if r.status == 200 else ""
    except (aiohttp.ClientError, TimeoutError):
        return None
    found = prometheus.values(text, {_INTENDED, _ACTUAL})
    if _INTENDED not in found or _ACTUAL not in found:
        return None
    return Clock(sum(found[_INTENDED]), sum(found[_ACTUAL]))


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
