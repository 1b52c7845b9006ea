"""GPUs that emulated servers share, as SGLang's two servers share one node's GPUs in the
shared topology: a step runs once the GPUs are free, so the servers' steps take turns, as
CUDA time-slices the processes on one GPU. Apart, each server runs on GPUs of its own.

The time at which the GPUs are next free is one double in a file every server of the group
maps, read and moved under an exclusive lock (microseconds a step). Each server reserves
only its next step, so a step waits at most for the other servers' current ones.
"""

from __future__ import annotations

import fcntl
import mmap
import os
from pathlib import Path

_STALE = 60.0  # seconds: a reservation further ahead is a previous run's (another boot's clock)


class SharedGpus:
    def __init__(self, path: str | Path) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if os.fstat(fd).st_size < 8:
                os.ftruncate(fd, 8)
            self._map = mmap.mmap(fd, 8)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self._free = memoryview(self._map).cast("d")

    def reserve(self, ready: float, seconds: float) -> float:
        """A step of ``seconds`` that could start at ``ready`` (monotonic time, the same
        clock in every process): when it starts, the GPUs then held until it ends."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            free = self._free[0]
            start = free if ready < free < ready + _STALE else ready
            self._free[0] = start + seconds
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        return start

    def close(self) -> None:
        self._free.release()
        self._map.close()
        os.close(self._fd)
