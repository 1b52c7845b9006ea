"""The end of the background tasks an app owns, at its cleanup: the router's and the
emulator's alike. Each task is cancelled, then waited for, so that none outlives what it
uses (the app's client session, the engine's GPUs); its cancellation ends here, and any
other exception it ended with is raised, so that a task that died is not silent.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable
from typing import Any


async def cancel_and_wait(tasks: Iterable[asyncio.Task[Any]]) -> None:
    waiting = list(tasks)  # all cancelled before any is waited for: they end together
    for task in waiting:
        task.cancel()
    for task in waiting:
        with contextlib.suppress(asyncio.CancelledError):
            await task
