"""``specroute`` commands as real processes on loopback, for what needs a process to die:
the one spawner (``specroute.loadgen.spawn``), killed at the end since a test need not wait."""

from __future__ import annotations

import signal
from asyncio.subprocess import Process
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from specroute.bench.compare import most_behind
from specroute.loadgen import lag
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


def kept_time(results: dict[str, Any]) -> None:
    """A live comparison whose emulators fell behind their time scale (``bench compare``
    says so in ``kept_time``) measured the machine, not the policies: the test skips,
    saying how late they ran, rather than conclude from it."""
    if results.get("kept_time") is False:
        lags = {p: most_behind(r) for p, r in results["policies"].items()}
        pytest.skip(f"the emulators did not keep their time scale (run or phase): {lags}")


def calibrated(code: int | None, output: str) -> None:
    """A calibration whose emulated servers fell behind their time scale twice at one level
    says so and concludes nothing: the test skips with its words rather than fail for the
    machine's sake; any other failure fails it."""
    if code != 0 and lag.CONCLUDED_NOTHING in output:
        pytest.skip(output.strip().splitlines()[-1])
    assert code == 0, output


def lost_more(results: dict[str, Any], policy: str, than: str) -> float:
    """How much more of a request's time ``policy``'s live run lost to its router and client
    than ``than``'s did (each run's ``elsewhere``): a closed loop's client waits that time
    out, so its throughput may fall behind by as much for the machine's sake alone."""
    away = {p: results["policies"][p].get("elsewhere") or 0.0 for p in (policy, than)}
    return away[policy] - away[than]
