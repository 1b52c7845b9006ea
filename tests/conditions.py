"""Waiting in a test for what the router does in its own time."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def until(condition: Any, seconds: float = 10.0) -> None:
    """Returns once ``condition()`` holds; fails the test after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not within the time given"
        await asyncio.sleep(0.02)
