"""A real engine's server as a process group of its own (its HTTP server forks the
scheduler, the engine core, the workers): started with its output in a temporary file,
stopped as a whole group; and a pair of them served until Ctrl-C."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import IO

from specroute.loadgen.spawn import Spawned

STOP_SECONDS = 20.0  # SIGTERM's grace before SIGKILL


@asynccontextmanager
async def group(
    argv: Sequence[str], env: Mapping[str, str], cwd: Path
) -> AsyncIterator[tuple[asyncio.subprocess.Process, IO[bytes]]]:
    """The process and the file its output goes to, until the block ends."""
    with tempfile.TemporaryFile() as output:
        process = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            cwd=cwd,
            start_new_session=True,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=asyncio.subprocess.STDOUT,
        )
        try:
            yield process, output
        finally:
            await stop(process)


async def stop(process: asyncio.subprocess.Process) -> None:
    """The server's whole process group: SIGTERM, then SIGKILL for what is left (the
    group's other members go too, even after the HTTP server's clean exit)."""
    if process.returncode is None:
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), STOP_SECONDS)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    await process.wait()


async def until_stopped(engine: str, spec: Spawned, base: Spawned) -> None:
    """Both servers until Ctrl-C (or SIGTERM), or until one exits, which is said."""
    print(f"speculative {spec.url}  plain {base.url}  (Ctrl-C stops both)", flush=True)
    stopped = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopped.set)
    exits = [asyncio.create_task(s.process.wait()) for s in (spec, base)]
    await asyncio.wait(
        [*exits, asyncio.create_task(stopped.wait())], return_when=asyncio.FIRST_COMPLETED
    )
    for name, server in (("spec", spec), ("base", base)):
        if server.process.returncode is not None:
            print(f"{engine} ({name}) exited: {server.said()}", file=sys.stderr)
