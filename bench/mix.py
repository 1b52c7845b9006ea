"""The mix a mixed run sends through a router, and how each answer is judged: streamed and
non-streamed chat, completions and native ``/generate`` requests, each with a unique
``rid``, some cancelled by the client part-way. Each one ends in a ``Verdict``: answered
whole, a clear failure (an HTTP error with an OpenAI- or SGLang-shaped body, an SSE error
event, a body cut with its connection), the client's own cancel, or lost: a hang past the
timeouts, a stream that ends without ``[DONE]``, a body that does not parse, an answer short
of its tokens or carrying another request's id. The ``Tally`` counts them; ``Limits`` are
the router's timeouts the client's own exceed, and the router is started with them
(``serving``).

The chaos (``bench/chaos.py``) and the soak (``bench/soak.py``) both send this mix.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import tempfile
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import aiohttp

from specroute.loadgen.spawn import NO_DRAIN, Spawned, spawned

Api = Literal["chat", "completions", "generate"]
PATHS: dict[Api, str] = {
    "chat": "/v1/chat/completions",
    "completions": "/v1/completions",
    "generate": "/generate",
}
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


def router_config(limits: Limits, **more: float | str) -> str:
    """The router's TOML settings: the limits, no drain grace, and ``more``."""
    settings: dict[str, float | str] = {
        "idle_timeout": limits.idle,
        "request_timeout": limits.deadline,
        "connect_timeout": 1.0,
        "drain_grace": 0.0,
    }
    settings.update(more)
    return "".join(f"{k} = {json.dumps(v)}\n" for k, v in settings.items())


@contextlib.asynccontextmanager
async def serving(
    limits: Limits, backends: Sequence[str], **more: float | str
) -> AsyncIterator[Spawned]:
    """A ``specroute serve`` process configured by ``router_config``, in front of
    ``backends`` (its ``--spec URL`` and ``--base URL`` arguments), once it is ready."""
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "router.toml"
        config.write_text(router_config(limits, **more))
        async with spawned(
            "serve", *NO_DRAIN, "--config", str(config), *backends, ready="/ready"
        ) as router:
            yield router


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
            return {
                "text": prompt,
                "sampling_params": params,
                "stream": self.stream,
                "rid": self.rid,
            }
        body: dict[str, Any] = {
            "model": "chaos",
            "max_tokens": self.max_tokens,
            "ignore_eos": True,
            "stream": self.stream,
            "rid": self.rid,
        }
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
_LABELS = {
    Verdict.ANSWERED: "200",
    Verdict.TIMEOUT: "timeout",
    Verdict.BROKEN: "broken",
    Verdict.GARBLED: "broken",
    Verdict.TRUNCATED: "truncated",
    Verdict.CANCELLED: "cancelled",
}
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
            self.lost.append(
                {
                    "verdict": str(ending.verdict),
                    "rid": one.rid,
                    "api": one.api,
                    "stream": one.stream,
                    "detail": ending.detail,
                }
            )

    def line(self) -> str:
        failed = sum(n for v, n in self.verdicts.items() if v not in _QUIET)
        garbled = self.verdicts[Verdict.GARBLED]
        return (
            f"answered {self.verdicts[Verdict.ANSWERED]}, failed clearly {failed}, "
            f"cancelled {self.verdicts[Verdict.CANCELLED]}, "
            f"{f'garbled {garbled}, ' if garbled else ''}"
            f"lost {self.verdicts[Verdict.LOST]}"
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "verdicts": dict(self.verdicts),
            "router_statuses": dict(self.labels),
            "refused": dict(self.refused),
            "lost": self.lost,
        }


_QUIET = (Verdict.ANSWERED, Verdict.CANCELLED, Verdict.GARBLED, Verdict.LOST)
