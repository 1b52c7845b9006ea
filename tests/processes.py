"""``specroute`` commands as real processes on loopback, for what needs a process to die."""

from __future__ import annotations

import asyncio
import sys
from asyncio.subprocess import PIPE, STDOUT, Process
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from specroute.bench.spawn import free_port, wait_ready


@asynccontextmanager
async def specroute(*args: str) -> AsyncIterator[tuple[str, Process]]:
    """Run ``specroute ARGS --port P``; yields its URL and process, killed at the end."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specroute", *args, "--port", str(port), stdout=PIPE, stderr=STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(process, f"{url}/health", args[0])
        yield url, process
    finally:
        if process.returncode is None:
            process.kill()
        await process.communicate()


@asynccontextmanager
async def emulator_pair(*flags: str) -> AsyncIterator[tuple[str, str]]:
    """A speculative and a plain emulated server started with the same flags; yields their
    URLs."""
    async with (
        specroute("emulate", "--mode", "spec", *flags) as (spec, _),
        specroute("emulate", "--mode", "base", *flags) as (base, _),
    ):
        yield spec, base
