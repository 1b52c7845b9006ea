"""``specroute bench chaos``: mixed traffic through one router while its backends are killed,
started again, stalled and cut, and every request accounted for on both sides.

One ``specroute serve`` process (idle timeout 1 s, deadline 4 s, health checks every
0.25 s, short ejections) in front of emulator processes (``spec_backends`` speculative,
``base_backends`` plain), each started with a ``--fault`` of its own, and a schedule drawn
from the seed: at given request counts a backend is killed (SIGKILL) and started again on
its port a while later (never while another is down), or given a fault through
``POST /emulator/faults`` (a refused connection, an error status, a stall, a cut stream, a
crash, compressed answers) for its next few requests.

The client sends the mix of ``bench/mix.py`` (chat, completions and ``/generate``, streamed
or not, some cancelled part-way) and judges each request there: answered, a clear failure,
its own cancel, or lost. Afterwards the router's counters must agree with that tally
(``bench/agreement.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

import aiohttp

from specroute.bench.agreement import agreement, check_lines, describe_races, races, settle
from specroute.bench.mix import Limits, Mix, Tally, ask, draw_asks, serving
from specroute.loadgen.spawn import Spawned, free_port, spawned

Action = Literal["kill", "faults"]
_RESTART_SECONDS = 0.3  # after a crash, before the backend is started again
_MAX_RESTARTS = 200  # per backend: a bound on its supervisor's loop
_START_TRIES = 5  # a start that fails (its port not yet free) is tried again

# What a "faults" event may set on a backend, each worn off after ``count`` requests: the
# router retries the first three kinds, times out or breaks on long stalls, relays the rest.
FAULT_MENU: tuple[str, ...] = (
    "refuse",
    "status:503",
    "cut_mid:0",
    "status:500",
    "status:429",
    "stall_first:2",
    "stall_first:6",
    "stall_mid:2,seconds=1.5",
    "stall_mid:1,seconds=0.3",
    "cut_mid:3",
    "cut_mid:2,mid_event=true",
    "crash:2",
    "crash",
    "compress",
)
# Each backend's ``--fault``, again after every start until an event replaces it.
FLAG_FAULTS: tuple[str, ...] = (
    "cut_mid:4,probability=0.01",
    "stall_first:0.2,probability=0.02",
    "compress,probability=0.05",
    "status:500,probability=0.005",
)


@dataclass(frozen=True)
class Event:
    """When the ``at``-th request starts, ``backend`` (an index, speculative ones first) is
    killed and started again ``down`` seconds later (unless another backend is down then),
    or given ``faults`` drawn by ``seed``."""

    at: int
    backend: int
    action: Action
    faults: tuple[str, ...] = ()
    down: float = 0.0
    seed: int = 0


@dataclass(frozen=True)
class ChaosPlan:
    requests: int = 3000
    concurrency: int = 16
    seed: int = 0
    spec_backends: int = 2
    base_backends: int = 2
    events: int | None = None  # drawn from the seed; None: one per 150 requests
    kill_share: float = 0.3  # of the events
    schedule: tuple[Event, ...] | None = None  # instead of drawn events
    flag_faults: tuple[str, ...] = FLAG_FAULTS  # backend i gets [i % len]; () none
    hardware: str = "kimi-k2.5-8x-pcie-fitted"
    time_scale: float = 0.1
    mix: Mix = field(default_factory=Mix)
    limits: Limits = field(default_factory=Limits)
    max_seconds: float = 900.0  # the whole run, however slow the machine

    def __post_init__(self) -> None:
        if self.requests < 1 or self.concurrency < 1 or (self.events or 0) < 0:
            raise ValueError("chaos needs requests and concurrency >= 1, events >= 0")
        if self.spec_backends < 1 or self.base_backends < 1:
            raise ValueError("chaos needs at least one backend in each pool")

    @property
    def pools(self) -> tuple[str, ...]:
        return ("spec",) * self.spec_backends + ("base",) * self.base_backends

    def drawn_schedule(self) -> tuple[Event, ...]:
        if self.schedule is not None:
            return self.schedule
        rng = random.Random(f"chaos-schedule:{self.seed}")
        events = []
        for _ in range(self.requests // 150 if self.events is None else self.events):
            at = rng.randrange(self.requests // 20, self.requests) if self.requests > 20 else 1
            backend = rng.randrange(len(self.pools))
            if rng.random() < self.kill_share:
                events.append(Event(at, backend, "kill", down=round(rng.uniform(0.2, 2.0), 2)))
                continue
            # one kind at a time: a refusal drawn with a stall would hide the stall
            faults = (f"{rng.choice(FAULT_MENU)},count={rng.randint(1, 5)}",)
            events.append(Event(at, backend, "faults", faults, seed=rng.randrange(1 << 30)))
        return tuple(sorted(events, key=lambda e: e.at))


@dataclass
class ChaosResult:
    plan: dict[str, Any]
    seconds: float
    tally: dict[str, Any]  # the client's: by verdict, by router status, the lost ones
    router: dict[str, Any]  # the router's counters at the end
    races: dict[str, Any]  # where the counts differ because a client's cancel raced
    checks: dict[str, str | None]  # each agreement: None when it holds, else what differs
    events: list[dict[str, Any]]  # what the schedule did, when
    restarts: dict[str, int]  # by backend
    downtimes: dict[str, list[float]]  # by backend: each death to answering again, seconds

    @property
    def ok(self) -> bool:
        return all(v is None for v in self.checks.values())

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"ok": self.ok}


class _Backend:
    """One emulator process on a fixed port, started again whenever it dies."""

    def __init__(self, name: str, pool: str, flags: tuple[str, ...]) -> None:
        self.name, self.pool, self.flags, self.port = name, pool, flags, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: Spawned | None = None
        self.restarts = 0
        self.downtimes: list[float] = []  # from each death to answering again, seconds
        self.up = asyncio.Event()
        self._down = _RESTART_SECONDS
        self._died_at: float | None = None
        self.failure: str | None = None  # why it could not be started again

    def kill(self, down: float) -> bool:
        if self.server is None or self.server.process.returncode is not None:
            return False
        self._down = down
        self.server.process.send_signal(signal.SIGKILL)
        return True

    async def keep(self, stopping: asyncio.Event) -> None:
        """Run it; after each death wait its down time and start it again, until stopped."""
        for _ in range(_MAX_RESTARTS):
            try:
                await self._run_once(stopping)
            except RuntimeError as exc:  # it would not start again: said, not raised
                self.failure = f"{self.name}: {exc}"
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), self._down)
            if stopping.is_set():
                return
            self._down, self.restarts = _RESTART_SECONDS, self.restarts + 1

    async def _run_once(self, stopping: asyncio.Event) -> None:
        for attempt in range(_START_TRIES):
            try:
                async with spawned(*self.flags, port=self.port, stop=signal.SIGKILL) as server:
                    self.server = server
                    self.up.set()
                    if self._died_at is not None:
                        self.downtimes.append(round(time.monotonic() - self._died_at, 2))
                    ended = asyncio.ensure_future(server.process.wait())
                    stop = asyncio.ensure_future(stopping.wait())
                    await asyncio.wait((ended, stop), return_when=asyncio.FIRST_COMPLETED)
                    for waiting in (ended, stop):
                        waiting.cancel()
                return
            except RuntimeError:  # it exited at start: the port still held, or a crash fault
                if attempt == _START_TRIES - 1:
                    raise
                await asyncio.sleep(0.5)
            finally:
                if self.server is not None:
                    self._died_at = time.monotonic()
                self.server = None
                self.up.clear()


async def _apply(
    event: Event, backends: Sequence[_Backend], session: aiohttp.ClientSession, t0: float
) -> dict[str, Any]:
    """Do what ``event`` says, unless a kill would leave more than one backend down."""
    backend = backends[event.backend]
    done: dict[str, Any] = {
        "at_request": event.at,
        "seconds": round(time.monotonic() - t0, 2),
        "backend": backend.name,
        "action": event.action,
    }
    if event.action == "kill":
        if any(b.server is None for b in backends):
            return done | {"down": event.down, "done": False, "why": "another backend is down"}
        return done | {"down": event.down, "done": backend.kill(event.down)}
    body = {"faults": list(event.faults), "seed": event.seed}
    try:
        async with session.post(f"{backend.url}/emulator/faults", json=body) as r:
            return done | {"faults": list(event.faults), "done": r.status == 200}
    except (aiohttp.ClientError, TimeoutError):
        return done | {"faults": list(event.faults), "done": False, "why": "it was down"}


def _emulator_flags(plan: ChaosPlan, index: int, pool: str) -> tuple[str, ...]:
    flags = (
        "emulate",
        "--mode",
        pool,
        "--hardware",
        plan.hardware,
        "--time-scale",
        f"{plan.time_scale:g}",
        "--seed",
        str(plan.seed + index),
    )
    if not plan.flag_faults:
        return flags
    return (*flags, "--fault", plan.flag_faults[index % len(plan.flag_faults)])


async def run_chaos(plan: ChaosPlan, say: Callable[[str], None] = lambda _: None) -> ChaosResult:
    """The whole run; ``say`` gets a progress line every twentieth of it, and the events."""
    backends = [
        _Backend(f"{pool}{i}", pool, _emulator_flags(plan, i, pool))
        for i, pool in enumerate(plan.pools)
    ]
    stopping = asyncio.Event()
    keepers = [asyncio.create_task(b.keep(stopping)) for b in backends]
    try:
        await _all_up(backends, keepers)
        urls = [arg for b in backends for arg in (f"--{b.pool}", b.url)]
        async with serving(
            plan.limits,
            urls,
            crossover=plan.concurrency / 2,
            topology="partitioned",
            health_interval=0.25,
            poll_interval=0.25,
            health_timeout=1.0,
            eject_seconds=0.5,
            eject_max_seconds=2.0,
        ) as router:
            return await _drive(plan, backends, router, say)
    finally:
        stopping.set()
        await asyncio.gather(*keepers, return_exceptions=True)


async def _all_up(backends: Sequence[_Backend], keepers: Sequence[asyncio.Task[None]]) -> None:
    """Until every backend has started once; raises what stopped one that could not."""
    for _ in range(1200):
        if all(b.up.is_set() for b in backends):
            return
        for backend, keeper in zip(backends, keepers, strict=True):
            if keeper.done():
                await keeper  # raises what stopped it, if anything did
                raise RuntimeError(backend.failure or f"{backend.name} stopped before it started")
        await asyncio.sleep(0.05)
    raise RuntimeError("the backends did not all start within a minute")


async def _drive(
    plan: ChaosPlan, backends: Sequence[_Backend], router: Spawned, say: Callable[[str], None]
) -> ChaosResult:
    asks = draw_asks(plan.requests, plan.mix, plan.seed)
    schedule = list(plan.drawn_schedule())
    tally, applying = Tally(), []
    t0 = time.monotonic()
    every = max(1, plan.requests // 20)
    started = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:

        async def apply(event: Event) -> dict[str, Any]:
            done = await _apply(event, backends, session, t0)
            undone = "" if done["done"] else f" (not done: {done['why']})"
            say(
                f"  at request {event.at}: {event.action} {done['backend']}"
                f"{''.join(' ' + f for f in event.faults)}{undone}"
            )
            return done

        async def client() -> None:
            nonlocal started
            for one in asks:
                if time.monotonic() > t0 + plan.max_seconds:
                    return
                started += 1
                while schedule and schedule[0].at <= started:
                    applying.append(asyncio.create_task(apply(schedule.pop(0))))
                tally.add(one, await ask(session, router.url, one, plan.limits))
                if tally.count % every == 0:
                    say(_progress(tally, plan.requests, time.monotonic() - t0, backends))

        await asyncio.gather(*(client() for _ in range(plan.concurrency)))
        events = list(await asyncio.gather(*applying))
        seconds = time.monotonic() - t0
        counts = await settle(session, router.url)
    checks = agreement(tally, counts)
    failed = [b.failure for b in backends if b.failure is not None]
    checks["every backend came back"] = "; ".join(failed) if failed else None  # the harness
    if tally.count < plan.requests:
        checks["finished"] = f"only {tally.count} of {plan.requests} requests in {seconds:.0f} s"
    described = asdict(plan) | {"schedule": [asdict(e) for e in plan.drawn_schedule()]}
    return ChaosResult(
        plan=described,
        seconds=round(seconds, 2),
        tally=tally.as_json(),
        router=counts.as_json(),
        races=races(tally, counts),
        checks=checks,
        events=events,
        restarts={b.name: b.restarts for b in backends},
        downtimes={b.name: b.downtimes for b in backends},
    )


def _progress(tally: Tally, total: int, seconds: float, backends: Sequence[_Backend]) -> str:
    down = [b.name for b in backends if b.server is None]
    return (
        f"chaos: {tally.count}/{total} requests, {tally.line()}; "
        f"{tally.count / seconds:.0f} req/s, {seconds:.0f} s"
        f"{'; down: ' + ', '.join(down) if down else ''}"
    )


def render(result: ChaosResult) -> str:
    t, r = result.tally, result.router
    kills = sum(1 for e in result.events if e["action"] == "kill" and e["done"])
    faults = sum(1 for e in result.events if e["action"] == "faults" and e["done"])
    lines = [
        f"chaos: {t['count']} requests in {result.seconds:.0f} s "
        f"({t['count'] / max(result.seconds, 1e-9):.0f} req/s); {kills} kills, {faults} fault "
        f"changes, {sum(result.restarts.values())} restarts (crashes included), backends down "
        f"{sum(sum(d) for d in result.downtimes.values()):.1f} s in all",
        "client: " + ", ".join(f"{k} {v}" for k, v in sorted(t["verdicts"].items())),
        "router requests_total: " + ", ".join(f"{k} {v:g}" for k, v in r["requests"].items()),
        f"router decisions {r['decisions_total']:g} = requests {t['count']} + retries "
        f"{r['decisions'].get('retry', 0):g}; upstream errors: "
        + ", ".join(f"{k} {v:g}" for k, v in r["upstream_errors"].items()),
        f"in flight at the end {r['inflight']:g}, router errors {r['router_errors']:g}, "
        f"ejections {r['ejections']:g}; cancels that raced: {describe_races(result.races)}",
    ]
    lines += check_lines(result.checks)
    lines += [f"  lost: {lost}" for lost in t["lost"][:10]]
    return "\n".join(lines)
