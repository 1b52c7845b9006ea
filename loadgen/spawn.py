"""The project's one process spawner: a ``specroute`` subcommand (or another Python module's
command line) as a process of its own on a free loopback port, waited for until it answers,
and stopped when the block ends.

How a comparison starts routers, the demo its servers, the capacity benchmark its emulator
and the tests what must be able to die. What the process prints goes to a temporary file
(a pipe nobody reads would stall a chatty process once it filled), for the error raised
when it exits at start and for ``Spawned.said``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import IO

import aiohttp

_STARTUP_SECONDS = 60.0
_STOP_SECONDS = 10.0  # after the stop signal, before the kill
_SAID_CHARS = 4000
# a router a benchmark starts stops at once: no load balancer waits on its readiness
NO_DRAIN = ("--drain-grace", "0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@dataclass(frozen=True)
class Spawned:
    url: str  # http://127.0.0.1:PORT
    process: asyncio.subprocess.Process
    output: IO[bytes]  # its stdout and stderr

    def said(self, chars: int = _SAID_CHARS) -> str:
        """The end of what the process has printed so far (read without moving the file's
        offset, which the process shares)."""
        fd = self.output.fileno()
        size = os.fstat(fd).st_size
        return os.pread(fd, chars, max(0, size - chars)).decode(errors="replace").strip()


@asynccontextmanager
async def spawned(
    *args: str,
    ready: str = "/health",
    stop: signal.Signals = signal.SIGTERM,
    port: int | None = None,
    module: str = "specroute",
    path: str | None = None,
) -> AsyncIterator[Spawned]:
    """Run ``specroute ARGS --port P`` until the block ends; yields it once ``ready`` answers
    200. A process that exits first raises with what it said. At the end it is sent
    ``stop`` (``SIGKILL`` for a test that need not wait) and killed if still running
    ``_STOP_SECONDS`` later. ``port``: a given one instead of a free one, to start a server
    again where its clients (a router) knew it. ``module``: another one to run with
    ``python -m`` (a benchmark's stub server, another project's router). ``path``: a folder
    searched first for ``module`` (another version of specroute, installed there with ``pip
    install --target``): the process runs in it, as ``python -m`` searches its own folder
    first, with it first on the search path of the processes it starts."""
    port = free_port() if port is None else port
    with tempfile.TemporaryFile() as output:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            module,
            *args,
            "--port",
            str(port),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=asyncio.subprocess.STDOUT,
            cwd=path,
            env=None if path is None else _searched_first(path),
        )
        server = Spawned(f"http://127.0.0.1:{port}", process, output)
        what = f"specroute {' '.join(args[:3])}" if module == "specroute" else module
        try:
            await wait_ready(server, ready, what)
            yield server
        finally:
            await _stop(process, stop)


def _searched_first(path: str) -> dict[str, str]:
    """This process's environment with ``path`` first on Python's search path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH")) if p)
    return env


async def _stop(process: asyncio.subprocess.Process, how: signal.Signals) -> None:
    if process.returncode is None:
        process.send_signal(how)
        try:
            await asyncio.wait_for(process.wait(), _STOP_SECONDS)
        except TimeoutError:
            process.kill()
    await process.wait()


async def wait_ready(
    server: Spawned,
    path: str,
    what: str,
    seconds: float = _STARTUP_SECONDS,
    interval: float = 0.1,
) -> None:
    """Until ``path`` answers 200; raises if the process exits first or time runs out."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    async with aiohttp.ClientSession() as session:
        while loop.time() < deadline:
            if server.process.returncode is not None:
                raise RuntimeError(f"{what} exited at start: {server.said()}")
            try:
                async with session.get(server.url + path) as r:
                    if r.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(interval)
    raise RuntimeError(
        f"{what} did not answer {server.url + path} within {seconds:g} s; it said: {server.said()}"
    )
