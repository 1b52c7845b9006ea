"""``specroute`` commands as real processes on loopback, for what needs a process to die."""

from __future__ import annotations

import asyncio
import sys
from asyncio.subprocess import PIPE, STDOUT, Process
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

from bench.spawn import free_port


async def wait_until_up(url: str, process: Process, seconds: float = 30) -> None:
    async with aiohttp.ClientSession() as s:
        for _ in range(int(seconds / 0.1)):
            if process.returncode is not None:
                raise RuntimeError(f"{url}: the process exited with {process.returncode}")
            try:
                async with s.get(f"{url}/health") as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise TimeoutError(f"{url} did not come up")


@asynccontextmanager
async def specroute(*args: str) -> AsyncIterator[tuple[str, Process]]:
    """Run ``specroute ARGS --port P``; yields its URL and process, killed at the end."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specroute", *args, "--port", str(port), stdout=PIPE, stderr=STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_until_up(url, process)
        yield url, process
    finally:
        if process.returncode is None:
            process.kill()
        await process.communicate()
