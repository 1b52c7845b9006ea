"""The event loop measurements run on: uvloop where it is installed, since a load
generator's own latency bends what it measures."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run(work: Coroutine[Any, Any, T]) -> T:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(work)
    return uvloop.run(work)
