"""``specroute`` commands as real processes on loopback, for what needs a process to die:
the one spawner (``specroute.loadgen.spawn``), killed at the end since a test need not wait."""

from __future__ import annotations

import signal
from asyncio.subprocess import Process
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from specroute.loadgen.spawn import spawned


@asynccontextmanager
async def specroute(*args: str) -> AsyncIterator[tuple[str, Process]]:
    """Run ``specroute ARGS --port P``; yields its URL and process."""
    async with spawned(*args, stop=signal.SIGKILL) as server:
        yield server.url, server.process


@asynccontextmanager
async def emulator_pair(*flags: str) -> AsyncIterator[tuple[str, str]]:
    """A speculative and a plain emulated server started with the same flags; yields their
    URLs."""
    async with (
        specroute("emulate", "--mode", "spec", *flags) as (spec, _),
        specroute("emulate", "--mode", "base", *flags) as (base, _),
    ):
        yield spec, base
