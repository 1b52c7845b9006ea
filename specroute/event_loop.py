"""The project's one event-loop runner: uvloop where it is installed, else asyncio's.

A load generator's own latency bends what it measures, and a server's bends what it serves.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


def run(work: Coroutine[Any, Any, T]) -> T:
    """Run ``work`` to its end on a new loop, as ``asyncio.run`` does."""
    with asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(work)
