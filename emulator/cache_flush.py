"""``/flush_cache``: the radix cache dropped while the server is idle, as SGLang 0.5.23 does.

With no ``timeout`` (or 0) the flush happens only if nothing runs or waits, and fails
(400) otherwise; with ``timeout`` seconds it waits up to that long for the server to fall
idle; one flush at a time. A server without a radix cache flushes nothing and succeeds,
as SGLang does (it clears its pools either way).
"""

from __future__ import annotations

import time

from specroute.emulator.errors import BadRequest
from specroute.emulator.loop import EngineLoop
from specroute.seconds import seconds

FLUSHED = "Cache flushed.\n"
BUSY = "Flush cache failed.\n"  # SGLang's answer when requests run and no timeout is given
TIMED_OUT = "Timed out waiting for idle state."
PENDING = "Another flush_cache is already in progress."


def timeout_of(raw: str | None) -> float:
    """The ``timeout`` query parameter (FastAPI's check; its 422 is SGLang's 400)."""
    try:
        return seconds(raw)
    except ValueError as exc:
        raise BadRequest(str(exc)) from None


class CacheFlush:
    def __init__(self, loop: EngineLoop) -> None:
        self._loop = loop
        self._pending = False

    async def flush(self, timeout: float) -> tuple[bool, str]:  # noqa: ASYNC109
        """Whether the cache was dropped, and what the server answers."""
        if self._pending:
            return False, PENDING
        engine = self._loop.engine
        if engine.idle:
            self._drop()
            return True, FLUSHED
        if timeout <= 0:
            return False, BUSY
        self._pending = True
        try:
            deadline = time.monotonic() + timeout
            while not engine.idle:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False, TIMED_OUT
                await self._loop.wait_progress(left)
            self._drop()
            return True, FLUSHED
        finally:
            self._pending = False

    def _drop(self) -> None:
        if self._loop.engine.cache is not None:
            self._loop.engine.cache.clear()
