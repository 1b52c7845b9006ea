"""``specroute`` subcommands as processes of their own on loopback, waited for until they
answer and stopped (SIGTERM, then kill) when done: how a comparison starts routers and
the demo starts its servers."""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp

_STARTUP_SECONDS = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@asynccontextmanager
async def spawned(*args: str, ready: str = "/health") -> AsyncIterator[str]:
    """Run ``specroute ARGS --port P`` until the block ends; yields its base URL once
    ``ready`` answers 200. A process that exits first raises with what it said."""
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specroute", *args, "--port", str(port),
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        await wait_ready(process, url + ready, " ".join(args[:3]))
        yield url
    finally:
        if process.returncode is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(process.wait(), 10)
            except TimeoutError:
                process.kill()
                await process.wait()


async def wait_ready(process: asyncio.subprocess.Process, url: str, what: str) -> None:
    """Until ``url`` answers 200; raises if the process exits first or time runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _STARTUP_SECONDS
    async with aiohttp.ClientSession() as session:
        while loop.time() < deadline:
            if process.returncode is not None:
                stream = process.stderr or process.stdout
                said = "" if stream is None else (await stream.read()).decode().strip()
                raise RuntimeError(f"specroute {what} exited at start: {said}")
            try:
                async with session.get(url) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.1)
    raise RuntimeError(f"specroute {what} did not answer {url} within {_STARTUP_SECONDS:g} s")
