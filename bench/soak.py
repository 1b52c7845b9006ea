"""``specroute bench soak``: a long run of mixed requests through one router, watching the
router process for what a leak would show: memory, file descriptors, sockets and threads
that grow with the requests served, or requests the router still counts in flight.

A ``specroute serve`` process in front of a speculative and a plain emulator (fast: a small
time scale and a few tokens a request); the client sends the mix of ``bench/mix.py`` (chat,
completions and ``/generate``, streamed or not, a few cancelled part-way, a few cut or
answered with an error by the backend's ``--fault``) and judges each request as the chaos
benchmark does. Before the first request, every ``every`` requests, and after the last once
the client has closed its connections and ``idle`` seconds have passed, it reads the
router's ``VmRSS`` and ``Threads`` (``/proc/PID/status``), its descriptors
(``/proc/PID/fd``), which of its sockets connect clients and which backends
(``/proc/PID/net/tcp``), its in-flight gauges and its count of asyncio tasks. After
the idle time the router must hold what it held before the first request, but for its pool
of upstream connections (``_left`` says why).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from specroute.bench.agreement import agreement, check_lines, describe_races, races, scrape, settle
from specroute.bench.mix import Limits, Mix, Tally, ask, draw_asks, serving
from specroute.loadgen.spawn import Spawned, spawned
from specroute.router.upstream.pool import KEEPALIVE

_TASK_READS = 30  # 0.1 s apart: six rounds of the router's 0.5 s poll
KEEPALIVE_SECONDS = 15.0  # aiohttp's, for health checks and polls: the longest an idle one stays
# aiohttp's session may keep one connection a backend for each of a health check, a metric
# poll and an abort that overlapped
SESSION_PER_BACKEND = 3
_FLAG_FAULTS = ("cut_mid:2,probability=0.005", "status:500,probability=0.005")  # spec, base


@dataclass(frozen=True)
class SoakPlan:
    requests: int = 100_000
    concurrency: int = 32
    every: int = 10_000  # a sample (and a progress line) every so many requests
    seed: int = 0
    hardware: str = "kimi-k2.5-8x-pcie-fitted"
    time_scale: float = 0.01
    mix: Mix = field(  # a request to cancel runs about half a second
        default_factory=lambda: Mix(cancel=0.02, max_tokens=(2, 8), cancel_tokens=4000)
    )
    limits: Limits = field(default_factory=Limits)
    flag_faults: tuple[str, str] | None = _FLAG_FAULTS  # the two backends' --fault
    idle: float = KEEPALIVE_SECONDS + 5  # after the last request, before the last sample

    def __post_init__(self) -> None:
        if min(self.requests, self.concurrency, self.every) < 1 or self.idle < 0:
            raise ValueError("soak needs requests, concurrency and every >= 1, idle >= 0")


@dataclass(frozen=True)
class ProcessStats:
    rss_kb: int
    threads: int
    fds: int
    sockets: int  # among the descriptors
    clients: int  # TCP connections to the router's port
    upstream: int  # TCP connections to the backends
    listening: int


def process_stats(pid: int, port: int, upstream_ports: Collection[int]) -> ProcessStats:
    """What ``/proc`` says of a process: memory, threads, descriptors, and its IPv4 TCP
    sockets by whom they connect: clients on ``port``, or backends on ``upstream_ports``."""
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    inodes = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(FileNotFoundError):  # closed while listed
            inodes.append(os.readlink(f"/proc/{pid}/fd/{fd}"))
    sockets = {t[8:-1] for t in inodes if t.startswith("socket:[")}
    clients = upstream = listening = 0
    for line in Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]:
        cells = line.split()  # sl local remote state ... inode (the tenth)
        if len(cells) < 10 or cells[9] not in sockets:
            continue
        local, remote = int(cells[1].split(":")[1], 16), int(cells[2].split(":")[1], 16)
        listening += cells[3] == "0A"
        clients += cells[3] != "0A" and local == port
        upstream += remote in upstream_ports
    return ProcessStats(
        int(fields["VmRSS"].split()[0]),
        int(fields["Threads"]),
        len(inodes),
        len(sockets),
        clients,
        upstream,
        listening,
    )


@dataclass(frozen=True)
class Sample:
    requests: int  # ended so far
    seconds: float  # since the first request
    rate: float  # requests a second since the sample before (0 at the start and the end)
    inflight: float  # the router's gauges, summed
    tasks: int  # the router's asyncio tasks, from its status page
    router: ProcessStats


@dataclass
class SoakResult:
    plan: dict[str, Any]
    seconds: float  # from the first request to the last
    start: Sample  # before the first request
    samples: list[Sample]  # every ``every`` requests
    end: Sample  # after the last, the client gone and ``idle`` seconds passed
    tally: dict[str, Any]
    router: dict[str, Any]
    races: dict[str, Any]  # where the counts differ because a client's cancel raced
    checks: dict[str, str | None]

    @property
    def ok(self) -> bool:
        return all(v is None for v in self.checks.values())

    def rss_growth_per_10k_kb(self) -> float | None:
        """From the first sample (warmed up) to the end, per 10,000 requests."""
        if not self.samples or self.end.requests == self.samples[0].requests:
            return None
        first, end = self.samples[0], self.end
        return (end.router.rss_kb - first.router.rss_kb) / (end.requests - first.requests) * 1e4

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok, "rss_growth_per_10k_kb": self.rss_growth_per_10k_kb()}


async def run_soak(plan: SoakPlan, say: Callable[[str], None] = lambda _: None) -> SoakResult:
    flags = (
        "--hardware",
        plan.hardware,
        "--time-scale",
        f"{plan.time_scale:g}",
        "--seed",
        str(plan.seed),
    )
    spec_fault = ("--fault", plan.flag_faults[0]) if plan.flag_faults else ()
    base_fault = ("--fault", plan.flag_faults[1]) if plan.flag_faults else ()
    async with (
        spawned("emulate", "--mode", "spec", *flags, *spec_fault) as spec,
        spawned("emulate", "--mode", "base", *flags, *base_fault) as base,
        serving(
            plan.limits,
            ("--spec", spec.url, "--base", base.url),
            crossover=plan.concurrency / 2,
            topology="partitioned",
        ) as router,
    ):
        watch = _Watch(router, (spec, base))
        return await _soak(plan, router.url, watch, say)


class _Watch:
    """Samples of the router process, each with the requests ended so far."""

    def __init__(self, router: Spawned, backends: Sequence[Spawned]) -> None:
        self.pid, self.port = router.process.pid, _port(router.url)
        self.upstream = {_port(b.url) for b in backends}
        self.t0 = time.monotonic()

    async def sample(
        self,
        probe: aiohttp.ClientSession,
        url: str,
        requests: int,
        since: Sample | None,
        tasks_at_most: float = math.inf,
    ) -> Sample:
        """``tasks_at_most``: read the task count again, for up to a few poll rounds, until
        it is no more than this: a health check or poll in progress holds a task per
        backend for a moment, a leaked task stays."""
        inflight = (await scrape(probe, url)).inflight
        tasks = await _tasks(probe, url)
        for _ in range(_TASK_READS):
            if tasks <= tasks_at_most:
                break
            await asyncio.sleep(0.1)
            tasks = await _tasks(probe, url)
        now = time.monotonic() - self.t0
        rate = (requests - since.requests) / (now - since.seconds) if since else 0.0
        stats = process_stats(self.pid, self.port, self.upstream)
        return Sample(requests, round(now, 2), round(rate, 1), inflight, tasks, stats)


async def _tasks(probe: aiohttp.ClientSession, url: str) -> int:
    async with probe.get(f"{url}/router/status") as r:
        return int((await r.json())["tasks"])


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


async def _soak(plan: SoakPlan, url: str, watch: _Watch, say: Callable[[str], None]) -> SoakResult:
    asks = draw_asks(plan.requests, plan.mix, plan.seed, prefix="soak")
    tally, samples = Tally(), list[Sample]()
    async with aiohttp.ClientSession() as probe:  # its one connection is there throughout
        start = await watch.sample(probe, url, 0, None)
        say(_line(plan, start, start))
        watch.t0 = time.monotonic()
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

            async def client() -> None:
                for one in asks:
                    tally.add(one, await ask(session, url, one, plan.limits))
                    if tally.count % plan.every == 0:
                        since = samples[-1] if samples else start
                        samples.append(await watch.sample(probe, url, tally.count, since))
                        say(_line(plan, start, samples[-1]))

            await asyncio.gather(*(client() for _ in range(plan.concurrency)))
        seconds = time.monotonic() - watch.t0
        await asyncio.sleep(plan.idle)
        counts = await settle(probe, url)
        end = await watch.sample(probe, url, tally.count, None, tasks_at_most=start.tasks)
        say(_line(plan, start, end, f"after {plan.idle:g} s idle"))
    # at most each client's at each backend, until the pool's sweep closes them
    in_use = 0 if plan.idle > KEEPALIVE else plan.concurrency * len(watch.upstream)
    in_use += SESSION_PER_BACKEND * len(watch.upstream)
    checks = agreement(tally, counts) | _left(start.router, end.router, in_use)
    checks["no task left"] = None if end.tasks <= start.tasks else f"{start.tasks} -> {end.tasks}"
    return SoakResult(
        asdict(plan),
        round(seconds, 2),
        start,
        samples,
        end,
        tally.as_json(),
        counts.as_json(),
        races(tally, counts),
        checks,
    )


def _left(start: ProcessStats, end: ProcessStats, in_use: int) -> dict[str, str | None]:
    """What the router holds after the client left and the idle time passed, against what
    it held before the first request. The requests' connections are closed 4 s after their
    last answer (``upstream_pool.KEEPALIVE``), each backend's apart: within that time up to
    ``in_use`` (every client's at every backend) may be kept, and none after it; ``in_use``
    also counts those of health checks, polls and aborts (aiohttp's session), which may
    stay open."""
    others = (start.fds - start.upstream, end.fds - end.upstream)
    return {
        "no client connection left": None
        if end.clients <= start.clients
        else f"{start.clients} -> {end.clients}",
        "no descriptor left but pooled upstream connections": None
        if others[1] <= others[0]
        else f"{others[0]} -> {others[1]}",
        "pooled upstream connections no more than were in use": None
        if end.upstream <= in_use
        else f"{end.upstream} where at most {in_use} were in use",
        "no thread left": None
        if end.threads <= start.threads
        else f"{start.threads} -> {end.threads}",
    }


def _line(plan: SoakPlan, start: Sample, s: Sample, note: str = "") -> str:
    r, grown = s.router, (s.router.rss_kb - start.router.rss_kb) / 1024
    return (
        f"soak: {s.requests:>7}/{plan.requests} requests{' ' + note if note else ''}, "
        f"{s.rate:.0f} req/s, router RSS {r.rss_kb / 1024:.1f} MB ({grown:+.1f}), "
        f"{r.fds} fds ({r.clients} client and {r.upstream} upstream connections), "
        f"{r.threads} threads, {s.tasks} tasks, in flight {s.inflight:g}, "
        f"{s.seconds:.0f} s"
    )


def render(result: SoakResult) -> str:
    t, growth = result.tally, result.rss_growth_per_10k_kb()
    start, end = result.start.router, result.end.router
    lines = [
        f"soak: {t['count']} requests in {result.seconds:.0f} s "
        f"({t['count'] / max(result.seconds, 1e-9):.0f} req/s)",
        "client: " + ", ".join(f"{k} {v}" for k, v in sorted(t["verdicts"].items())),
        f"router RSS {start.rss_kb / 1024:.1f} MB before, {end.rss_kb / 1024:.1f} MB after; "
        f"from the first sample on, {'-' if growth is None else f'{growth:+.0f} kB'} per 10k "
        "requests",
        f"after idle: {end.fds} descriptors against {start.fds} before ({end.clients} client "
        f"connections, {end.upstream} pooled upstream), {end.threads} threads against "
        f"{start.threads}, in flight {result.end.inflight:g}; cancels that raced: "
        f"{describe_races(result.races)}",
    ]
    lines += check_lines(result.checks)
    return "\n".join(lines)
