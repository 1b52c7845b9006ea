"""``specroute bench overhead``: what a router adds between a client and its backends,
measured on loopback in one run, side by side with no router, a bare Python pass-through
and SGLang's gateways in Rust.

Two stub backends (``bench/servers/stub_backend.py``: SGLang's endpoints, paced SSE, nearly free
in CPU) stand behind every target (``bench/overhead_targets.py``), each target's requests
spread over both. For each repeat, level
and mode (streamed or whole answers) every target gets one window of closed-loop load
(``bench/overhead_load.py``), the targets' order rotated from one level to the next so
that none always runs first or last; before each window, a warm-up at the same
concurrency opens the connections. Over each window: the time to the first chunk and
between chunks, requests and chunks per second, and the CPU time of the router's process
tree, of each backend and of this load generator, from ``/proc``. A target's "added"
figures are its own less direct's, in the same repeat, at the same level.

On a machine of four cores or more the router, the backends and the load generator are
pinned to cores of their own, from their start (a runtime that sizes its thread pool by
the cores it may use sees its own); on fewer they share, which is said in the output, and the
load generator's and backends' CPU shares tell how much of the machine they took.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import statistics
import time
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from specroute.bench.overhead_load import Address, Load, Sampled, address, run_window
from specroute.bench.overhead_profile import FORMATS, Profiles
from specroute.bench.overhead_targets import (
    GATEWAYS,
    Target,
    is_profiled,
    start_backends,
    start_targets,
)
from specroute.bench.process_cpu import (
    cpu_seconds,
    descendants,
    pin_tree,
    tree_cpu_seconds,
    tree_run_periods,
)
from specroute.bench.wake_cost import measure as wake_cost
from specroute.loadgen.progress import Progress

MODES = ("stream", "whole")
PIN_MIN_CORES = 4


@dataclass(frozen=True)
class OverheadPlan:
    levels: tuple[int, ...] = (1, 4, 16, 64, 256, 512)
    repeats: int = 3
    workers: tuple[int, ...] = (1, 2)  # specroute serve --workers, one target each
    bare_workers: tuple[int, ...] = (1,)  # the bare pass-through's processes, one target each
    online_off: bool = False  # also specroute-w1-online-off: one worker, --online off
    aiohttp_front: bool = False  # also specroute-w1-aiohttp: one worker, --front aiohttp
    one_backend: bool = False  # also specroute-wN-one-backend: every request on one stub
    lean: bool = False  # also lean: the pass-through without aiohttp (servers/lean_proxy)
    baseline: str | None = None  # also specroute-wN-baseline: the code installed in this folder
    modes: tuple[str, ...] = MODES
    warmup: float = 0.75  # seconds of load before each window
    seconds: float = 1.5  # each window
    chunks: int = 16  # events per streamed answer
    gap_ms: float = 20.0  # between them
    gateways: tuple[str, ...] = ("smg",)  # routers in Rust to compare, each when installed
    router_cores: int | None = None  # pinned: each router's cores; None: the most workers
    profile_dir: str | None = None  # py-spy profiles of the Python routers, when given
    profile_levels: tuple[int, ...] = (256,)  # those of them among levels
    profile_format: str = "speedscope"
    profile_seconds: float = 5.0  # each profiled window
    idle: float = 2.0  # seconds of no load, once, for the routers' background CPU

    def __post_init__(self) -> None:
        if not self.levels or min(self.levels) < 1 or self.repeats < 1 or not self.workers:
            raise ValueError("overhead needs levels >= 1, repeats >= 1 and a worker count")
        if not self.bare_workers or min((*self.workers, *self.bare_workers)) < 1:
            raise ValueError("overhead needs workers >= 1 and bare workers >= 1")
        if self.chunks < 2 or self.gap_ms <= 0:
            raise ValueError("overhead needs chunks >= 2 and gap_ms > 0")
        if not set(self.gateways) <= set(GATEWAYS):
            raise ValueError(f"overhead's gateways are among {', '.join(GATEWAYS)}")
        if self.router_cores is not None and self.router_cores < 1:
            raise ValueError("overhead needs router_cores >= 1")
        if self.profile_format not in FORMATS or self.profile_seconds <= 0:
            raise ValueError(f"overhead profiles in {', '.join(FORMATS)}, over seconds > 0")
        if self.baseline is not None and not Path(self.baseline, "specroute").is_dir():
            raise ValueError(
                f"overhead's baseline is a folder with specroute installed in it (pip install "
                f"--target {self.baseline} --no-deps specroute-VERSION.whl)"
            )
        if self.warmup <= 0 or self.seconds <= 0 or not set(self.modes) <= set(MODES):
            raise ValueError(f"overhead needs warmup, seconds > 0 and modes among {MODES}")

    @property
    def answer_seconds(self) -> float:
        """How long the backend takes over one answer, streamed or whole."""
        return (self.chunks - 1) * self.gap_ms / 1000


@dataclass(frozen=True)
class Window:
    """One target's figures over one window; latencies in milliseconds, CPU in seconds of
    CPU per second of wall time (1.0: one core busy)."""

    target: str
    mode: str
    level: int
    repeat: int
    seconds: float
    requests: int  # ended in the window
    errors: int  # failed or cut off, warm-up and drain included
    ttfc_p50: float | None  # over the requests that started in the window
    ttfc_p99: float | None
    gap_p50: float | None  # between a stream's chunks
    requests_per_s: float
    chunks_per_s: float | None  # None for whole answers
    router_cpu_ms_per_request: float | None  # None for direct
    router_wakes_per_request: float | None  # times its processes were put on a core
    router_cores: float | None
    backend_cores: tuple[float, ...]  # the two stubs'
    client_cores: float


@dataclass
class _Readings:
    """CPU seconds as a window opens and as it closes, and the router's wake-ups."""

    router: int | None  # None for direct
    backends: tuple[int, ...]
    at: list[tuple[float, ...]] = field(default_factory=list)  # router, backends, this one
    woken: list[int] = field(default_factory=list)  # the router's run periods

    def take(self) -> None:
        routed = tree_cpu_seconds(self.router) if self.router is not None else 0.0
        self.at.append(
            (routed or 0.0, *(cpu_seconds(p) or 0.0 for p in self.backends), time.process_time())
        )
        self.woken.append((tree_run_periods(self.router) or 0) if self.router is not None else 0)

    def used(self) -> tuple[float, ...]:
        before, after = self.at
        return tuple(b - a for a, b in zip(before, after, strict=True))

    def wakes(self) -> int:
        before, after = self.woken
        return after - before


def _percentile(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def figures(
    target: Target,
    mode: str,
    level: int,
    repeat: int,
    sampled: Sampled,
    cpu: tuple[float, ...],
    wakes: int,
) -> Window:
    t0, t1, wall = sampled.t0, sampled.t1, sampled.t1 - sampled.t0
    ok = [r for r in sampled.replies if r.ok and r.first is not None and r.end is not None]
    started = [r for r in ok if t0 <= r.start <= t1]
    ended = [r for r in ok if r.end is not None and t0 <= r.end <= t1]
    ttfc = [1000 * (r.first - r.start) for r in started if r.first is not None]
    chunks = [r.events[:-1] for r in ok]  # the last event is [DONE]
    gaps = [1000 * (b - a) for e in chunks for a, b in itertools.pairwise(e)]
    router, *backends, client = cpu
    counted = len(ended)
    per_request = target.pid is not None and counted > 0
    return Window(
        target=target.name,
        mode=mode,
        level=level,
        repeat=repeat,
        seconds=wall,
        requests=counted,
        errors=sum(1 for r in sampled.replies if not r.ok) + sampled.cut,
        ttfc_p50=_percentile(ttfc, 0.5),
        ttfc_p99=_percentile(ttfc, 0.99),
        gap_p50=statistics.median(gaps) if gaps else None,
        requests_per_s=counted / wall,
        chunks_per_s=(
            sum(1 for e in chunks for t in e if t0 <= t <= t1) / wall if mode == "stream" else None
        ),
        router_cpu_ms_per_request=1000 * router / counted if per_request else None,
        router_wakes_per_request=wakes / counted if per_request else None,
        router_cores=None if target.pid is None else router / wall,
        backend_cores=tuple(b / wall for b in backends),
        client_cores=client / wall,
    )


def pinning(cores: Sequence[int], router_cores: int) -> dict[str, set[int]] | None:
    """Which of ``cores`` the router, the backends and the load generator run on; None
    below ``PIN_MIN_CORES``. Each router gets ``router_cores`` (every one the same cores,
    one after another), leaving one to the backends and at least two to the load
    generator."""
    if len(cores) < PIN_MIN_CORES:
        return None
    routers = max(1, min(router_cores, len(cores) - 3))
    return {
        "router": set(cores[:routers]),
        "backends": {cores[routers]},
        "load": set(cores[routers + 1 :]),
    }


def machine_note(cores: Sequence[int], pinned: dict[str, set[int]] | None) -> str:
    if pinned is None:
        return (
            f"not pinned: {len(cores)} cores (the router, the backends and the load "
            "generator share them)"
        )
    return "pinned: " + ", ".join(f"{k} on cores {sorted(v)}" for k, v in pinned.items())


def schedule(plan: OverheadPlan, targets: Sequence[str]) -> list[tuple[int, int, str, str]]:
    """Every window as (repeat, level, mode, target), interleaved: for each repeat, each
    level, each mode, every target, the targets' order rotated one step each time."""
    windows, turn = [], 0
    for repeat in range(plan.repeats):
        for level in plan.levels:
            for mode in plan.modes:
                shift = turn % len(targets)
                windows += [(repeat, level, mode, t) for t in (*targets[shift:], *targets[:shift])]
                turn += 1
    return windows


async def measure_overhead(
    plan: OverheadPlan, note: Callable[[str], None], on_window: Callable[[Window], None]
) -> dict[str, Any]:
    """Start the backends and targets, run every window, stop them all; returns what ran."""
    cores = sorted(os.sched_getaffinity(0))
    pinned = pinning(cores, plan.router_cores or max(plan.workers))
    note(machine_note(cores, pinned))

    def run_on(part: str) -> None:  # what this process starts next inherits it
        if pinned is not None:
            os.sched_setaffinity(0, pinned[part])

    async with AsyncExitStack() as stack:
        stack.callback(os.sched_setaffinity, 0, cores)  # this process's, as it was
        run_on("backends")
        backends = await start_backends(stack, plan.chunks, plan.gap_ms)
        run_on("router")
        targets = await start_targets(
            stack,
            backends,
            plan.workers,
            plan.gateways,
            note,
            plan.bare_workers,
            plan.online_off,
            plan.lean,
            plan.aiohttp_front,
            plan.one_backend,
            plan.baseline,
        )
        if pinned is not None:  # again: threads started before the affinity was set
            for pid in (*backends.pids, backends.idle_pid):
                pin_tree(pid, pinned["backends"])
            for target in targets:
                if target.pid is not None:
                    pin_tree(target.pid, pinned["router"])
            os.sched_setaffinity(0, pinned["load"])
        wake = wake_cost(None if pinned is None else min(pinned["router"]))  # before any load
        note(wake.note())
        idle = await _idle_cores(targets, plan.idle)
        processes = {t.name: len(descendants(t.pid)) for t in targets if t.pid is not None}
        note(
            f"routers idle for {plan.idle:g} s before any load (pollers, health checks): "
            + ", ".join(
                f"{name} {busy:.3f} cores ({processes[name]} processes)"
                for name, busy in idle.items()
            )
        )
        await _measured(plan, targets, backends.pids, note, on_window)
        profiled = []
        if plan.profile_dir is not None:
            routers = [t for t in targets if is_profiled(t.name)]
            levels = [n for n in plan.profile_levels if n in plan.levels]
            where = Profiles(Path(plan.profile_dir), plan.profile_format)
            longer = replace(plan, seconds=plan.profile_seconds)
            profiled = await where.record(
                routers, levels, plan.modes, partial(_window, longer), note
            )
    return {
        "targets": [t.name for t in targets],
        "profiles": profiled,
        "cores": len(cores),
        "machine": machine_note(cores, pinned),
        "idle_router_cores": idle,
        "router_processes": processes,
        "wake": wake.as_json(),
    }


async def _measured(
    plan: OverheadPlan,
    targets: list[Target],
    backend_pids: tuple[int, ...],
    note: Callable[[str], None],
    on_window: Callable[[Window], None],
) -> None:
    """Every measured window, in the plan's order, each handed to ``on_window``."""
    by_name = {t.name: t for t in targets}
    windows = schedule(plan, list(by_name))
    progress = Progress(len(windows))
    note(
        f"each window: {plan.warmup:g} s of warm-up at its full concurrency (its "
        f"connections are opened then), then {plan.seconds:g} s measured"
    )
    for repeat, level, mode, name in windows:
        target = by_name[name]
        readings = _Readings(target.pid, backend_pids)
        progress.begin(f"{name} {mode}", level, repeat)
        began = time.monotonic()
        sampled = await _window(plan, target, level, mode, readings.take)
        window = figures(target, mode, level, repeat, sampled, readings.used(), readings.wakes())
        on_window(window)
        progress.finish(_line(window), time.monotonic() - began)


def _load(plan: OverheadPlan, target: Target, level: int, mode: str) -> tuple[list[Address], Load]:
    stream = mode == "stream"
    spread = min(plan.answer_seconds, plan.warmup / 2)
    addresses = [address(u, stream, plan.chunks) for u in target.urls]
    return addresses, Load(level, stream, plan.warmup, plan.seconds, spread)


async def _window(
    plan: OverheadPlan, target: Target, level: int, mode: str, snapshot: Callable[[], None]
) -> Sampled:
    return await run_window(*_load(plan, target, level, mode), snapshot)


async def _idle_cores(targets: Sequence[Target], seconds: float) -> dict[str, float]:
    """Each router's CPU share with no request at all: at low levels its CPU per request
    is mostly this background work, shared out over few requests."""
    routers = {t.name: t.pid for t in targets if t.pid is not None}
    before = {name: tree_cpu_seconds(pid) or 0.0 for name, pid in routers.items()}
    began = time.monotonic()
    await asyncio.sleep(seconds)
    wall = time.monotonic() - began
    return {
        name: ((tree_cpu_seconds(pid) or 0.0) - before[name]) / wall
        for name, pid in routers.items()
    }


def _line(w: Window) -> str:
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x:.1f}"

    router = "" if w.router_cores is None else f", router {w.router_cores:.2f} cores"
    return (
        f"TTFC p50 {ms(w.ttfc_p50)} ms, {w.requests_per_s:.0f} req/s{router}, "
        f"backends {max(w.backend_cores):.2f}, load {w.client_cores:.2f}, "
        f"{w.errors} errors"
    )
