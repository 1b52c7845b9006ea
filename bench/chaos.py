"""``specroute bench chaos``: mixed traffic through one router while its backends are killed,
started again, stalled and cut, and every request accounted for on both sides.

One ``specroute serve`` process (idle timeout 1 s, deadline 4 s, health checks every
0.25 s, short ejections) in front of emulator processes (``spec_backends`` speculative,
``base_backends`` plain), each started with a ``--fault`` of its own, and a schedule drawn
from the seed: at given request counts a backend is killed (SIGKILL) and started again on
its port a while later (never while another is down), or given a fault through
``POST /emulator/faults`` (a refused connection, an error status, a stall, a cut stream, a
crash, compressed answers) for its next few requests.

The client sends streamed and non-streamed chat, completions and native ``/generate``
requests, each with a unique ``rid``, and cancels some of them itself part-way. Each one
ends in a ``Verdict``: answered whole, a clear failure (an HTTP error with an OpenAI- or
SGLang-shaped body, an SSE error event, a body cut with its connection), the client's own
cancel, or lost: a hang past the timeouts, a stream that ends without ``[DONE]``, a body
that does not parse, an answer short of its tokens or carrying another request's id.
Afterwards the router's counters must agree with that tally (``agreement``).

The soak (``bench/soak.py``) sends the same mix and judges it the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import signal
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import aiohttp

from specroute import prometheus
from specroute.bench.spawn import Spawned, free_port, spawned

# The mix: one request, judged

Api = Literal["chat", "completions", "generate"]
PATHS: dict[Api, str] = {
    "chat": "/v1/chat/completions", "completions": "/v1/completions", "generate": "/generate",
}  # fmt: skip
_WORDS = ("route", "draft", "verify", "token", "batch", "queue", "stream", "cache", "model")


@dataclass(frozen=True)
class Mix:
    stream: float = 0.5  # share of streamed requests
    cancel: float = 0.06  # share the client cancels part-way
    apis: tuple[Api, ...] = ("chat", "chat", "completions", "generate")  # drawn uniformly
    max_tokens: tuple[int, int] = (4, 48)
    cancel_tokens: int = 400  # a request to be cancelled runs long, so it is cut mid-way


@dataclass(frozen=True)
class Limits:
    """The router's timeouts, which the client's own exceed by ``slack``: a request still
    unanswered then hangs, which the router's timeouts should have prevented."""

    idle: float = 1.0  # the router's idle_timeout
    deadline: float = 4.0  # its request_timeout
    slack: float = 5.0

    def client_timeout(self, stream: bool) -> aiohttp.ClientTimeout:
        """Two attempts (a retry), each up to the router's limit, and the slack."""
        if stream:
            return aiohttp.ClientTimeout(
                sock_connect=self.slack, sock_read=2 * self.idle + self.slack
            )
        return aiohttp.ClientTimeout(total=2 * self.deadline + self.slack)


@dataclass(frozen=True)
class Ask:
    rid: str
    api: Api
    stream: bool
    max_tokens: int
    cancel_at: float | None = None  # streams: after this many events; else after seconds

    def body(self) -> dict[str, Any]:
        prompt = f"request {self.rid}: " + " ".join(_WORDS[ord(c) % len(_WORDS)] for c in self.rid)
        if self.api == "generate":
            params = {"max_new_tokens": self.max_tokens, "ignore_eos": True}
            return {"text": prompt, "sampling_params": params, "stream": self.stream,
                    "rid": self.rid}  # fmt: skip
        body: dict[str, Any] = {"model": "chaos", "max_tokens": self.max_tokens,
                                "ignore_eos": True, "stream": self.stream,
                                "rid": self.rid}  # fmt: skip
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.api == "chat":
            return body | {"messages": [{"role": "user", "content": prompt}]}
        return body | {"prompt": prompt}


def draw_asks(count: int, mix: Mix, seed: int, prefix: str = "chaos") -> Iterator[Ask]:
    """``count`` requests of the mix, the same ones for the same seed, drawn as needed."""
    rng = random.Random(f"{prefix}:{seed}")
    for i in range(count):
        api, stream = rng.choice(mix.apis), rng.random() < mix.stream
        if rng.random() < mix.cancel:
            cancel_at = float(rng.randint(1, 3)) if stream else round(rng.uniform(0.05, 0.2), 3)
            yield Ask(f"{prefix}-{seed}-{i}", api, stream, mix.cancel_tokens, cancel_at)
        else:
            yield Ask(f"{prefix}-{seed}-{i}", api, stream, rng.randint(*mix.max_tokens))


class Verdict(StrEnum):
    ANSWERED = "answered"  # 200, whole
    BACKEND_ERROR = "backend_error"  # a backend's error status, relayed with its body
    REFUSED = "refused"  # the router's 502 or 503: no backend it tried could take it
    TIMEOUT = "timeout"  # the router's 504
    BROKEN = "broken"  # the stream ended with an SSE error event
    TRUNCATED = "truncated"  # a non-streamed body cut off with its connection
    CANCELLED = "cancelled"  # the client's own doing
    # A compressed stream that broke: the router wrote its error event uncompressed into
    # the gzip body, which the client cannot decode. Not silent, but not the error event
    # the router promises either: a router bug this benchmark found, counted apart.
    GARBLED = "garbled"
    LOST = "lost"  # none of the above: what the router must never do


# The router's ``status`` label for each verdict; a refusal is in no backend's count.
_LABELS = {Verdict.ANSWERED: "200", Verdict.TIMEOUT: "timeout", Verdict.BROKEN: "broken",
           Verdict.GARBLED: "broken", Verdict.TRUNCATED: "truncated",
           Verdict.CANCELLED: "cancelled"}  # fmt: skip
_UNTRIED = "No healthy backend"  # the router's refusal before trying any backend


@dataclass(frozen=True)
class Ending:
    verdict: Verdict
    status: int | None = None
    detail: str = ""

    @property
    def label(self) -> str | None:
        """The ``status`` the router should count this request under, if any."""
        if self.verdict is Verdict.BACKEND_ERROR:
            return str(self.status)
        return _LABELS.get(self.verdict)


def _lost(detail: str) -> Ending:
    return Ending(Verdict.LOST, detail=detail)


async def ask(session: aiohttp.ClientSession, url: str, one: Ask, limits: Limits) -> Ending:
    """Send ``one`` and judge how it ended; never raises for what the server did."""
    if one.stream or one.cancel_at is None:
        return await _ask(session, url, one, limits)
    try:
        return await asyncio.wait_for(_ask(session, url, one, limits), one.cancel_at)
    except TimeoutError:
        return Ending(Verdict.CANCELLED)


async def _ask(session: aiohttp.ClientSession, url: str, one: Ask, limits: Limits) -> Ending:
    timeout = limits.client_timeout(one.stream)
    try:
        async with session.post(url + PATHS[one.api], json=one.body(), timeout=timeout) as r:
            if r.status != 200:
                return _error(r.status, await r.read())
            if one.stream:
                return await _stream(r, one)
            try:
                raw = await r.read()
            except TimeoutError:
                raise
            except aiohttp.ClientError:
                return Ending(Verdict.TRUNCATED, 200)
            return _whole(one, [_parsed(raw)])
    except TimeoutError:
        return _lost(f"nothing from the router for {limits.slack:g} s past its timeouts")
    except aiohttp.ClientError as exc:
        return _lost(f"{type(exc).__name__}: {exc}")


def _parsed(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return value if isinstance(value, dict) else None


def _error(status: int, raw: bytes) -> Ending:
    """An OpenAI-shaped body is the router's own; SGLang's (``object: error``) a backend's."""
    body = _parsed(raw) or {}
    if isinstance(body.get("error"), dict):
        message = str(body["error"].get("message", ""))
        if status == 504:
            return Ending(Verdict.TIMEOUT, status, message[:200])
        if status in (502, 503):
            untried = "untried" if message.startswith(_UNTRIED) else "tried"
            return Ending(Verdict.REFUSED, status, untried)
        return _lost(f"the router refused a valid request: HTTP {status}: {message[:200]}")
    if body.get("object") == "error" and status != 503:  # a backend's 503 is retried
        return Ending(Verdict.BACKEND_ERROR, status)
    return _lost(f"HTTP {status} with a body the client cannot read as an error: {raw[:200]!r}")


async def _stream(r: aiohttp.ClientResponse, one: Ask) -> Ending:
    try:
        return await _events(r, one)
    except aiohttp.ClientPayloadError as exc:
        if "decode" in str(exc) and r.headers.get("Content-Encoding", "identity") != "identity":
            return Ending(Verdict.GARBLED, 200, str(exc)[:200])
        raise


async def _events(r: aiohttp.ClientResponse, one: Ask) -> Ending:
    events: list[dict[str, Any] | None] = []
    done, error = False, None
    async for line in r.content:
        data = line.strip()
        if not data.startswith(b"data:"):
            continue
        data = data[5:].strip()
        if data == b"[DONE]":
            done = True
            continue
        event = _parsed(data)
        if event is not None and "error" in event:
            error = event
            continue
        events.append(event)
        if one.cancel_at is not None and len(events) >= one.cancel_at:
            r.close()
            return Ending(Verdict.CANCELLED)
    if error is not None:
        return Ending(Verdict.BROKEN, 200, str(error["error"])[:200])
    if not done:
        return _lost(f"the stream ended without [DONE] after {len(events)} events")
    return _whole(one, events)


def _whole(one: Ask, events: Sequence[dict[str, Any] | None]) -> Ending:
    """Every event (or the one body) is this request's, and the last says it is complete."""
    tokens, finished = None, False
    for event in events:
        if event is None:
            return _lost("an event or body that does not parse as a JSON object")
        meta = event.get("meta_info") or {}
        rid = meta.get("id") if one.api == "generate" else event.get("id")
        if rid != one.rid:
            return _lost(f"an answer with the id {rid!r}, not {one.rid!r}")
        if one.api == "generate":
            tokens = meta.get("completion_tokens")
            finished = (meta.get("finish_reason") or {}).get("type") == "length"
        else:
            tokens = (event.get("usage") or {}).get("completion_tokens", tokens)
            reasons = [c.get("finish_reason") for c in event.get("choices") or []]
            finished = finished or "length" in reasons
    if not finished or tokens != one.max_tokens:
        return _lost(f"incomplete: {tokens} of {one.max_tokens} tokens, finished {finished}")
    return Ending(Verdict.ANSWERED, 200)


class Tally:
    """The client's count of how its requests ended."""

    def __init__(self) -> None:
        self.count = 0
        self.verdicts: Counter[str] = Counter()
        self.labels: Counter[str] = Counter()  # what the router should count, by status
        self.refused: Counter[str] = Counter()  # tried or untried
        self.lost: list[dict[str, Any]] = []

    def add(self, one: Ask, ending: Ending) -> None:
        self.count += 1
        self.verdicts[ending.verdict] += 1
        if ending.label is not None:
            self.labels[ending.label] += 1
        if ending.verdict is Verdict.REFUSED:
            self.refused[ending.detail] += 1
        if ending.verdict in (Verdict.LOST, Verdict.GARBLED) and len(self.lost) < 100:
            self.lost.append({"verdict": str(ending.verdict), "rid": one.rid, "api": one.api,
                              "stream": one.stream, "detail": ending.detail})  # fmt: skip

    def line(self) -> str:
        failed = sum(n for v, n in self.verdicts.items() if v not in _QUIET)
        garbled = self.verdicts[Verdict.GARBLED]
        return (f"answered {self.verdicts[Verdict.ANSWERED]}, failed clearly {failed}, "
                f"cancelled {self.verdicts[Verdict.CANCELLED]}, "
                f"{f'garbled {garbled}, ' if garbled else ''}"
                f"lost {self.verdicts[Verdict.LOST]}")  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        return {"count": self.count, "verdicts": dict(self.verdicts),
                "router_statuses": dict(self.labels), "refused": dict(self.refused),
                "lost": self.lost}  # fmt: skip


_QUIET = (Verdict.ANSWERED, Verdict.CANCELLED, Verdict.GARBLED, Verdict.LOST)


# The router's side


@dataclass(frozen=True)
class RouterCounts:
    requests: dict[str, float]  # specroute_requests_total by status
    served: dict[str, float]  # specroute_requests_total by backend
    decisions: dict[str, float]  # specroute_route_decisions_total by reason
    upstream_errors: dict[str, float]  # by kind
    inflight: float  # every specroute_inflight summed
    router_errors: float
    ejections: float

    @classmethod
    def read(cls, text: str) -> RouterCounts:
        def by(name: str, label: str) -> dict[str, float]:
            found: Counter[str] = Counter()
            for s in prometheus.samples(text, (name,)):
                found[s.labels.get(label, "")] += int(s.value)
            return dict(sorted(found.items()))

        def total(name: str) -> float:
            return sum(s.value for s in prometheus.samples(text, (name,)))

        return cls(
            by("specroute_requests_total", "status"),
            by("specroute_requests_total", "backend"),
            by("specroute_route_decisions_total", "reason"),
            by("specroute_upstream_errors_total", "kind"),
            total("specroute_inflight"), total("specroute_router_errors_total"),
            total("specroute_backend_ejections_total"),
        )  # fmt: skip

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"decisions_total": sum(self.decisions.values())}


async def scrape(session: aiohttp.ClientSession, url: str) -> RouterCounts:
    async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
        return RouterCounts.read(await r.text())


async def settle(session: aiohttp.ClientSession, url: str, seconds: float = 15.0) -> RouterCounts:
    """The router's counts once nothing is in flight (a cancel lands a moment later), or
    after ``seconds`` whatever they are."""
    counts = await scrape(session, url)
    for _ in range(int(seconds / 0.05)):
        if counts.inflight == 0:
            break
        await asyncio.sleep(0.05)
        counts = await scrape(session, url)
    return counts


def races(tally: Tally, counts: RouterCounts) -> dict[str, Any]:
    """Where the router's counts may differ from the client's, and only because a client's
    cancel raced the router: each bounded by the cancels in ``agreement``.

    ``by_status``: router minus client, where they differ; a cancel that reached the router
    after it had relayed the whole answer (or the error event of a broken stream) is counted
    there as such. ``undecided``: cancels that left before the router decided where to send
    them, in none of its counts. ``failed_then_left``: backend failures after the first byte
    on requests the router counted cancelled, the client gone before the error event."""
    labels = set(tally.labels) | set(counts.requests)
    diff = {s: counts.requests.get(s, 0) - tally.labels[s] for s in sorted(labels)}
    e, r = counts.upstream_errors, counts.requests
    before_first_byte = (e.get("connect", 0) + e.get("unavailable", 0) + e.get("midstream", 0)
                         + e.get("timeout", 0) - r.get("timeout", 0) - r.get("broken", 0)
                         - r.get("truncated", 0))  # fmt: skip
    retries = counts.decisions.get("retry", 0)
    return {
        "by_status": {s: d for s, d in diff.items() if d != 0},
        "undecided": tally.count + retries - sum(counts.decisions.values()),
        "failed_then_left": before_first_byte - retries - tally.refused["tried"],
    }


def agreement(tally: Tally, counts: RouterCounts) -> dict[str, str | None]:
    """Each check by name: None when it holds, else what differs. Exact, but for the races
    of a client's cancels (``races``), each of which must be one of the cancels."""
    checks: dict[str, str | None] = {}
    lost = tally.verdicts[Verdict.LOST]
    checks["nothing lost"] = None if lost == 0 else f"{lost} lost: {tally.lost[:3]}"
    garbled = tally.verdicts[Verdict.GARBLED]
    checks["no garbled streams"] = None if garbled == 0 else f"{garbled} compressed streams"
    raced = races(tally, counts)
    diff, undecided = raced["by_status"], raced["undecided"]
    wrong = {s: d for s, d in diff.items() if (d < 0 if s != "cancelled" else d > 0)}
    checks["statuses agree"] = (  # each decided request counted once, as the client saw it
        None if not wrong and sum(diff.values()) == -undecided
        else f"router minus client by status: {diff}, {undecided:g} never decided"
    )  # fmt: skip
    cancels = tally.verdicts[Verdict.CANCELLED]
    retries = counts.decisions.get("retry", 0)
    checks["decisions = requests + retries"] = (
        None if 0 <= undecided <= cancels
        else f"{sum(counts.decisions.values()):g} decisions, {tally.count} requests, "
        f"{retries:g} retries"
    )  # fmt: skip
    left = raced["failed_then_left"]
    checks["retries explained"] = (  # every failure before a first byte retried or refused
        None if 0 <= left <= counts.requests.get("cancelled", 0)
        else f"{left:+g} failures before a first byte beyond {retries:g} retries and "
        f"{tally.refused['tried']} refusals"
    )  # fmt: skip
    checks["in flight ends at 0"] = None if counts.inflight == 0 else f"{counts.inflight:g}"
    checks["no router errors"] = None if counts.router_errors == 0 else f"{counts.router_errors:g}"
    return checks


def router_config(limits: Limits, **more: float | str) -> str:
    """The router's TOML settings: the limits, no drain grace, and ``more``."""
    settings: dict[str, float | str] = {
        "idle_timeout": limits.idle, "request_timeout": limits.deadline,
        "connect_timeout": 1.0, "drain_grace": 0.0,
    }  # fmt: skip
    settings.update(more)
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())


# The chaos: backends that die, a schedule of faults

Action = Literal["kill", "faults"]
_RESTART_SECONDS = 0.3  # after a crash, before the backend is started again
_MAX_RESTARTS = 200  # per backend: a bound on its supervisor's loop
_START_TRIES = 5  # a start that fails (its port not yet free) is tried again

# What a "faults" event may set on a backend, each worn off after ``count`` requests: the
# router retries the first three kinds, times out or breaks on long stalls, relays the rest.
FAULT_MENU: tuple[str, ...] = (
    "refuse", "status:503", "cut_mid:0", "status:500", "status:429", "stall_first:2",
    "stall_first:6", "stall_mid:2,seconds=1.5", "stall_mid:1,seconds=0.3", "cut_mid:3",
    "cut_mid:2,mid_event=true", "crash:2", "crash", "compress",
)  # fmt: skip
# Each backend's ``--fault``, again after every start until an event replaces it.
FLAG_FAULTS: tuple[str, ...] = (
    "cut_mid:4,probability=0.01", "stall_first:0.2,probability=0.02",
    "compress,probability=0.05", "status:500,probability=0.005",
)  # fmt: skip


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
    hardware: str = "kimi-k2.5-8x-pcie"
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
    done: dict[str, Any] = {"at_request": event.at, "seconds": round(time.monotonic() - t0, 2),
                            "backend": backend.name, "action": event.action}  # fmt: skip
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
    flags = ("emulate", "--mode", pool, "--hardware", plan.hardware,
             "--time-scale", f"{plan.time_scale:g}", "--seed", str(plan.seed + index))  # fmt: skip
    if not plan.flag_faults:
        return flags
    return (*flags, "--fault", plan.flag_faults[index % len(plan.flag_faults)])


async def run_chaos(plan: ChaosPlan, say: Callable[[str], None] = lambda _: None) -> ChaosResult:
    """The whole run; ``say`` gets a progress line every twentieth of it, and the events."""
    backends = [_Backend(f"{pool}{i}", pool, _emulator_flags(plan, i, pool))
                for i, pool in enumerate(plan.pools)]  # fmt: skip
    stopping = asyncio.Event()
    keepers = [asyncio.create_task(b.keep(stopping)) for b in backends]
    try:
        await _all_up(backends, keepers)
        with tempfile.TemporaryDirectory() as folder:
            config = Path(folder) / "router.toml"
            config.write_text(router_config(
                plan.limits, crossover=plan.concurrency / 2, topology="partitioned",
                health_interval=0.25, poll_interval=0.25, health_timeout=1.0,
                eject_seconds=0.5, eject_max_seconds=2.0,
            ))  # fmt: skip
            urls = [arg for b in backends for arg in (f"--{b.pool}", b.url)]
            async with spawned("serve", "--config", str(config), *urls, ready="/ready") as router:
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
            say(f"  at request {event.at}: {event.action} {done['backend']}"
                f"{''.join(' ' + f for f in event.faults)}{undone}")  # fmt: skip
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
        plan=described, seconds=round(seconds, 2), tally=tally.as_json(),
        router=counts.as_json(), races=races(tally, counts), checks=checks,
        events=events, restarts={b.name: b.restarts for b in backends},
        downtimes={b.name: b.downtimes for b in backends},
    )  # fmt: skip


def _progress(tally: Tally, total: int, seconds: float, backends: Sequence[_Backend]) -> str:
    down = [b.name for b in backends if b.server is None]
    return (f"chaos: {tally.count}/{total} requests, {tally.line()}; "
            f"{tally.count / seconds:.0f} req/s, {seconds:.0f} s"
            f"{'; down: ' + ', '.join(down) if down else ''}")  # fmt: skip


def describe_races(raced: dict[str, Any]) -> str:
    said = [f"router minus client {raced['by_status']}"] if raced["by_status"] else []
    said += [f"{raced[k]:g} {k.replace('_', ' ')}" for k in ("undecided", "failed_then_left")
             if raced[k]]  # fmt: skip
    return ", ".join(said) or "none"


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
    for name, problem in result.checks.items():
        lines.append(f"  {'ok  ' if problem is None else 'FAIL'} {name}"
                     f"{'' if problem is None else ': ' + problem}")  # fmt: skip
    lines += [f"  lost: {lost}" for lost in t["lost"][:10]]
    return "\n".join(lines)
