"""One contender of ``specroute bench deployments`` live: its servers as ``specroute emulate``
processes at a time scale, a ``specroute serve`` router in front with the contender's policy
and profile, and the trace's requests sent through the router by their arrival times, each
with its context (synthetic words, a word a token) and its output length.

Times are given back in the emulated servers' seconds (wall seconds over the time scale),
so a live row reads as the offline one beside it. Each run reads the servers' clocks before
and after: one they could not keep time in, or whose router and client took more than a
sliver of a request's time, says so (``loadgen.lag``), and its figures are not to be
concluded from."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from specroute.bench.contenders import Contender
from specroute.loadgen import lag
from specroute.loadgen.client import request_body, send, served_model
from specroute.loadgen.dataset import Prompt, default_words, words_text
from specroute.loadgen.record import RequestRecord, mean_latency
from specroute.loadgen.request_trace import RequestTrace
from specroute.loadgen.spawn import NO_DRAIN, spawned

STREAM_INTERVAL = "16"  # tokens an event: the client's cost stays off the servers' clock


@dataclass(frozen=True)
class LiveRun:
    records: list[RequestRecord]  # times in emulated seconds from the trace's start
    lag: float | None  # the servers' together (``loadgen.lag.overall``)
    elsewhere: float | None  # a request's time spent elsewhere (``loadgen.lag.elsewhere``)


async def serve_live(
    contender: Contender,
    trace: RequestTrace,
    model: Sequence[str],
    time_scale: float,
    folder: Path,
    until: float,
) -> LiveRun:
    """Every request of ``trace`` through ``contender`` deployed as processes; those not
    finished ``until`` emulated seconds from the start are cancelled, and have no end."""
    scale = ("--time-scale", f"{time_scale:g}", "--stream-interval", STREAM_INTERVAL)
    async with AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(
                spawned("emulate", *model, "--mode", s.mode, *s.flags, *scale)
            )
            for s in contender.servers
        ]
        # a backends file, as a pool may be empty there (one that serves a single pool has
        # the router as its least-load balancer); every server in the one GPU group the
        # offline replay puts them in
        backends = folder / f"{contender.name}-backends.json"
        targets = [
            {"targets": [p.url], "labels": {"pool": s.pool}}
            for s, p in zip(contender.servers, servers, strict=True)
        ]
        backends.write_text(json.dumps(targets))
        routing = ["--policy", contender.policy]
        routing += [f for k, v in contender.params.items() for f in ("--policy-param", f"{k}={v}")]
        if contender.profile is not None:
            profile = folder / f"{contender.name}-profile.json"
            profile.write_text(json.dumps(contender.profile))
            routing += ["--profile", str(profile)]
        router = await stack.enter_async_context(
            spawned("serve", *NO_DRAIN, "--backends-file", str(backends), *routing)
        )
        urls = [p.url for p in servers]
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            before = await lag.clocks(session, urls)
            records = await replay_live(
                session, router.url, contender.name, trace, time_scale, until
            )
            after = await lag.clocks(session, urls)
    timed = mean_latency(records)
    return LiveRun(
        records, lag.overall(before, after), lag.elsewhere(before, after, timed, time_scale)
    )


async def replay_live(
    session: aiohttp.ClientSession,
    url: str,
    name: str,
    trace: RequestTrace,
    time_scale: float,
    until: float,
) -> list[RequestRecord]:
    """Every request of ``trace`` sent to ``url`` at its arrival (scaled by ``time_scale``),
    those not finished ``until`` emulated seconds from the start cancelled; the records'
    times in emulated seconds."""
    model = await served_model(session, url)
    rng = random.Random(f"deployments|{name}")
    start = time.monotonic()
    records: list[RequestRecord] = []
    tasks: list[asyncio.Task[RequestRecord]] = []
    for request in trace.requests:
        delay = start + request.at * time_scale - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        text = words_text(rng, default_words(request.prompt_tokens))
        prompt = Prompt(({"role": "user", "content": text},), max(1, request.output_tokens))
        record = RequestRecord(name, 0, 0, time.monotonic())
        records.append(record)
        body = request_body(prompt, model, ignore_eos=True)
        tasks.append(asyncio.create_task(send(session, url, body, record)))
    left = start + until * time_scale - time.monotonic()
    _, late = await asyncio.wait(tasks, timeout=max(0.0, left)) if tasks else (set(), set())
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
    for record in records:
        if record.end is None and record.error is None:
            record.error = "cancelled: not finished when the replay ended"
    return [emulated(r, start, time_scale) for r in records]


def emulated(record: RequestRecord, start: float, time_scale: float) -> RequestRecord:
    """``record`` with its times in emulated seconds from ``start``."""

    def at(t: float) -> float:
        return (t - start) / time_scale

    record.start = at(record.start)
    record.first_token = None if record.first_token is None else at(record.first_token)
    record.end = None if record.end is None else at(record.end)
    record.chunks = [(at(t), n) for t, n in record.chunks]
    return record
