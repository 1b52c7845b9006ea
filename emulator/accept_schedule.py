"""The speculative server's accept length on a schedule of emulated time: a drafter swap or
a new prompt mix, rehearsed while the server runs (``--accept-schedule "0:3.0,30:1.6"``).

Each change sets the default accept length at its time, in the model's own seconds since
the server started (its wall seconds over the time scale live; the virtual clock offline),
as ``POST /emulator/acceptance`` with ``accept_length`` would; the requests running and
waiting take it at once. Rules for particular prompts stay as they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from specroute.emulator.acceptance import AcceptanceError, accept_rate
from specroute.emulator.engine import Engine


@dataclass(frozen=True)
class AcceptChange:
    at: float  # emulated seconds since the server started
    accept_length: float


def parse_schedule(text: str, steps: int) -> tuple[AcceptChange, ...]:
    """``T:TAU`` pairs, comma-separated, ``T`` ascending; each ``TAU`` a reachable accept
    length for ``steps`` drafts. An AcceptanceError names the bad pair."""
    changes: list[AcceptChange] = []
    for part in (p.strip() for p in text.split(",")):
        at, colon, length = part.partition(":")
        try:
            change = AcceptChange(float(at), float(length))
        except ValueError:
            raise AcceptanceError(
                f"accept schedule: {part!r} is not SECONDS:ACCEPT_LENGTH"
            ) from None
        if not colon or change.at < 0 or (changes and change.at <= changes[-1].at):
            raise AcceptanceError(f"accept schedule: {part!r}: times must be >= 0 and ascending")
        accept_rate(change.accept_length, steps)  # reachable, or the error says why
        changes.append(change)
    return tuple(changes)


def apply(engine: Engine, change: AcceptChange) -> None:
    """The change in force from now on, for new requests and those already in the engine."""
    engine.acceptance = engine.acceptance.updated({"accept_length": change.accept_length})
    retake(engine)


def retake(engine: Engine) -> None:
    """Every request in the engine takes the acceptance now in force."""
    for seq in (*engine.running, *engine.waiting):
        seq.accept_rate = engine.acceptance.rate_for(seq.prompt)
