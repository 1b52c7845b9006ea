"""What a process and its descendants cost in CPU, and where they may run: Linux ``/proc``
and ``sched_setaffinity``. A server that forks workers is measured as its whole tree."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

N = TypeVar("N", int, float)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _schedstat(pid: int, field: int) -> list[int]:
    """One field of each living thread's ``/proc/PID/task/TID/schedstat``: 0 its time on a
    core (ns), 2 how many times it was put on one; empty where unavailable."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):  # a thread just gone
                found.append(
                    int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[field])
                )
    return found


def cpu_seconds(pid: int) -> float | None:
    """CPU time of a process, all its threads; None where unavailable (the process is gone,
    or there is no /proc). Read from the scheduler's nanosecond counters of each living
    thread (``schedstat``): the user and system times of ``/proc/PID/stat`` count clock
    ticks of 10 ms, too coarse for a window of a few requests. Where schedstat is missing,
    those times instead (they also keep the threads that exited)."""
    ns = _schedstat(pid, 0)
    if ns:
        return sum(ns) / 1e9
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICKS


def run_periods(pid: int) -> int | None:
    """How many times the scheduler put a process on a core, all its threads (the third
    field of each thread's ``schedstat``): for a process that sleeps when it has nothing
    to do, its wake-ups; None where unavailable."""
    counts = _schedstat(pid, 2)
    return sum(counts) if counts else None


def descendants(pid: int) -> list[int]:
    """``pid`` and every process below it, read from each thread's ``children`` list."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{current}/task"):
                with contextlib.suppress(OSError):
                    children = Path(f"/proc/{current}/task/{task}/children").read_text()
                    todo.extend(int(c) for c in children.split())
    return found


def tree_cpu_seconds(pid: int) -> float | None:
    """CPU time of ``pid`` and its living descendants (a worker that exited is not
    counted: compare two readings only while the tree is unchanged)."""
    return _tree_sum(pid, cpu_seconds)


def tree_run_periods(pid: int) -> int | None:
    """``run_periods`` of ``pid`` and its living descendants."""
    return _tree_sum(pid, run_periods)


def _tree_sum(pid: int, reading: Callable[[int], N | None]) -> N | None:
    """``reading`` of ``pid`` summed with its living descendants'; None where ``pid``'s
    is unavailable."""
    readings = [reading(p) for p in descendants(pid)]
    first = readings[0]
    if first is None:
        return None
    return sum((r for r in readings[1:] if r is not None), first)


def pin_tree(pid: int, cores: set[int]) -> None:
    """Every thread of ``pid`` and its descendants onto ``cores`` (an affinity is a
    thread's own: setting the process's sets only its first thread's)."""
    for process in descendants(pid):
        with contextlib.suppress(OSError):
            for task in os.listdir(f"/proc/{process}/task"):
                with contextlib.suppress(OSError):
                    os.sched_setaffinity(int(task), cores)
