"""Online calibration in a running router: the official openai client through the router to
two emulators, the samples taken at each request's end, the fit shown on the status page and
in the metrics."""

from __future__ import annotations

import asyncio
import gc
import json
import random
import statistics
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from openai.types.chat import ChatCompletionMessageParam

from specroute.emulator.predict import as_profile, predict
from specroute.loadgen.lag import clock, lag
from specroute.model_flags import config_from_flags
from specroute.online.samples import Sample
from specroute.policies.view import Pool
from specroute.router.serve import short_turns
from specroute.router.tasks.online_fits import fit_now
from tests.conditions import until
from tests.emulator.test_emulator_api import CHAT, client
from tests.emulators import running_emulator
from tests.routers import running_router


async def streamed(url: str, usage: bool, words: str | None = None, max_tokens: int = 48) -> None:
    """One chat streamed through the router to its end (``words``: its one message, else
    the usual chat), its usage asked for or not."""
    asked: list[ChatCompletionMessageParam] = [{"role": "user", "content": words or ""}]
    messages = CHAT if words is None else asked
    stream = await client(url).chat.completions.create(
        model="m",
        messages=messages,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": usage},
    )
    async for _ in stream:
        pass


async def test_streams_become_samples_of_the_load_they_decoded_under(
    backends: tuple[str, str],
) -> None:
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=2.5) as (url, state):
        assert str(state.online.mode) == "observe"  # the default
        await asyncio.gather(
            *(streamed(url, usage=True) for _ in range(3)),
            *(streamed(url, usage=False) for _ in range(3)),  # the router asks for it
        )
        await client(url).chat.completions.create(model="m", messages=CHAT, max_tokens=1)
        samples = state.online.samples.window(time.monotonic())
        assert len(samples) == 6  # an answer of one token has no decode to time: no sample
        assert {s.pool for s in samples} == {"spec", "base"}  # six at once: past 2.5
        # the mean load each decoded under, the others of the six among it
        assert max(s.load for s in samples) >= 3 and all(1 <= s.load <= 6 for s in samples)
        assert all(0 < s.tpot < 1 for s in samples)
        # on one GPU group (shared, the default) all six ran beside the other pool's
        assert all(0 < s.beside < s.load for s in samples)
        await fit_now(state)
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{url}/router/status") as r:
                online = (await r.json())["online"]
            async with s.get(f"{url}/metrics") as r:
                metrics = await r.text()
        assert online["mode"] == "observe" and online["samples"] == 6
        assert online["adopted_crossover"] is None
        levels = online["fits"][0]["levels"]  # so that none is what a level alone means
        assert sum(row["samples"] for rows in levels.values() for row in rows) == 0
        assert online["shared_gpus"]["samples_left_out"] == 6
        assert 'specroute_online_samples_left_out{reason="beside_other_pool"} 6.0' in metrics
        gauged = [x for x in metrics.splitlines() if x.startswith("specroute_online_samples{")]
        assert not gauged  # the gauge of samples per level shows none counted
        assert "specroute_profile_drift{" in metrics
        assert "specroute_online_adopted 0.0" in metrics


async def test_a_sample_counts_the_prompts_its_gpus_were_sent_while_it_decoded(
    backends: tuple[str, str],
) -> None:
    """A stream's sample carries the prompt tokens the router sent to its GPU group (both
    servers: shared, the default) between its first byte and its end, per output token
    after its first: the prefill its decode waited for. One sent before its first byte is
    not among them. The status page says whether the fit reads samples at their prefill."""
    spec, base = backends
    prompt = "word " * 800  # 4,000 bytes: 1,000 tokens at the default 0.25 a byte
    flags = {"crossover": 2.5, "online_at_prefill": True}
    async with running_router(spec=[spec], base=[base], **flags) as (url, state):
        await client(url).chat.completions.create(  # before the stream: not beside it
            model="m", messages=[{"role": "user", "content": prompt}], max_tokens=1
        )
        stream = await client(url).chat.completions.create(
            model="m",
            messages=CHAT,
            max_tokens=160,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = aiter(stream)
        await anext(chunks)
        await client(url).chat.completions.create(
            model="m", messages=[{"role": "user", "content": prompt}], max_tokens=1
        )
        tokens = [c.usage.completion_tokens async for c in chunks if c.usage is not None]
        samples = state.online.samples.window(time.monotonic())
        await fit_now(state)
        async with aiohttp.ClientSession() as s, s.get(f"{url}/router/status") as r:
            online = (await r.json())["online"]
    assert online["at_prefill"] is True and online["fits"][0]["prefill_slope"] == 0.0  # one
    assert len(samples) == 1  # the whole answers, of one token, make none
    (sample,) = samples
    assert sample.prefill is not None and tokens[-1] > 100
    sent = sample.prefill * (tokens[-1] - 1)
    assert 950 <= sent <= 1100, sent  # the one sent during its decode, not the one before it


async def test_online_off_records_nothing(backends: tuple[str, str]) -> None:
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=8, online="off") as (url, state):
        await streamed(url, usage=True)
        assert len(state.online.samples) == 0


async def test_adopt_routes_by_the_live_crossover_the_fit_adopted(
    backends: tuple[str, str],
) -> None:
    spec, base = backends
    async with running_router(spec=[spec], base=[base], crossover=8, online="adopt") as (
        url,
        state,
    ):
        pools = []
        for adopted in (None, 0.0, None):  # the profile's; the live one (pays nowhere); back
            state.online.adopted = adopted
            raw = await client(url).chat.completions.with_raw_response.create(
                model="m", messages=CHAT, max_tokens=4
            )
            pools.append(raw.headers["x-specroute-backend"].split(":")[0])
        assert pools == ["spec", "base", "spec"]


# The emulators keep their time at this scale on two cores (at 0.05 their steps ran 60% to
# 80% late there, and what the router learnt from them moved with the machine's load)
SCALE = 0.2
DROP = 5.0  # emulated seconds in (1 s at SCALE): before the router has a single sample
KIMI = ("--hardware", "kimi-k2.5-8x-pcie-fitted", "--max-running-requests", "256")
LATE = 0.25  # the most the emulators' steps may run late, in all, for the run to count


async def test_a_live_router_follows_the_emulator_s_drop_in_acceptance(tmp_path: Path) -> None:
    """Profiled at accept length 3.0 (crossover near 5, in the servers' scaled time), four
    clients speculate; 5 emulated seconds in, the speculative server's accept length falls
    to 1.6 and speculation pays only below about 2 or 3: the router learns it from the
    requests it serves and sends those that join past the live crossover to the plain server.

    The clients go on until each has had four requests answered that it sent with a live
    crossover adopted after the drop, or for 30 s. What is asserted is that the router
    learns within the deadline, a live crossover below the profile's, and where the
    decisions made from then on sent the requests that joined past it. A run whose emulators did not keep
    their time (a loaded machine) says so and is skipped: it would say nothing."""
    profiled = config_from_flags((*KIMI, "--accept-length", "3.0"), "spec")
    document: dict[str, Any] = as_profile(predict(profiled, [1, 2, 4, 8], 128, 128), profiled)
    for row in document["levels"]:  # the servers run at SCALE: so do their TPOTs
        for pool in ("spec", "base"):
            row[pool]["tpot_ms"]["median"] *= SCALE
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(document))
    timing = ("--time-scale", str(SCALE), "--stream-interval", "4")
    schedule = ("--accept-schedule", f"0:3,{DROP:g}:1.6")
    async with (
        aiohttp.ClientSession() as session,
        running_emulator("--mode", "spec", *KIMI, *timing, *schedule) as spec,
    ):
        dropped = time.monotonic() + DROP * SCALE  # the emulator's clock started before this
        async with (
            running_emulator("--mode", "base", *KIMI, *timing) as base,
            running_router(
                spec=[spec],
                base=[base],
                profile=profile,
                online="adopt",
                online_interval=0.2,
                online_window_samples=24,
                online_min_samples=12,
                online_explore_share=0.5,  # the plain server seen alone at 2 to 4 in seconds
                recent_decisions=1000,
            ) as (url, state),
        ):
            served: list[tuple[float, str, bool]] = []  # answered at, by, sent after learning
            left_out: set[int] = set()  # the samples each fit left out, read at each answer
            since: list[float] = []  # when a request was first sent after learning (wall time)
            urls = (spec, base)
            clocks = [await clock(session, u) for u in urls]  # how late their steps run
            started = time.monotonic()

            async def client_loop(k: int) -> None:
                sent, learnt = 0, 0
                while learnt < 4 and time.monotonic() - started < 30.0:
                    sent += 1
                    adopted = state.online.adopted is not None and time.monotonic() > dropped
                    if adopted and not since:
                        since.append(time.time())
                    words = f"client {k} request {sent}: say something"  # lengths of its own
                    raw = await client(url).chat.completions.with_raw_response.create(
                        model="m",
                        messages=[{"role": "user", "content": words}],
                        max_tokens=256,  # natural lengths: in lockstep they join at 1, 2, 3, 4
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    async for _ in raw.parse():
                        pass
                    answered = time.monotonic() - started
                    served.append((answered, raw.headers["x-specroute-backend"], adopted))
                    learnt += adopted
                    left_out.add(state.online.left_out)

            await asyncio.gather(*(client_loop(k) for k in range(4)))
            ran = [lag(c, await clock(session, u)) for c, u in zip(clocks, urls, strict=True)]
            assert None not in ran, ran  # both emulators stepped and counted their time
            late = max(r for r in ran if r is not None)
    if late >= LATE:  # the machine, not the model, set the pace: nothing to conclude from
        pytest.skip(f"the emulators' steps ran {late:.0%} late (more than {LATE:.0%})")
    before = [b for _, b, adopted in served if not adopted]  # routed by the profile
    # (of which exploration's turns may take up to its share, 0.5, to the plain server)
    assert before and sum(b.startswith("spec") for b in before) / len(before) > 0.4, served
    assert since and sum(adopted for *_, adopted in served) >= 12, served  # within 30 s
    # the decisions from then on at a load past the live crossover adopted, below 4 (short of
    # the profile's near 5): the plain server's; below it, speculation still pays live
    crossover = state.online.adopted
    assert crossover is not None and crossover < 4
    decided = [d for d in state.decisions.recent if d["at"] >= since[0]]
    routed = [d for d in decided if d["reason"] != "explore"]  # the policy's, not the turns'
    past = [d["pool"] for d in routed if d["live_concurrency"] >= max(2, crossover)]
    assert len(past) >= 8 and past.count("base") / len(past) > 0.8, (crossover, decided)
    # each speculative sample carries its server's accept length at its end; the fit stands
    # at the one after the drop, and leaves out the samples taught at 3.0 while they are kept
    kept = state.online.samples.window(time.monotonic())
    assert any(s.accept_length is not None for s in kept if s.pool == "spec")
    assert all(s.accept_length is None for s in kept if s.pool == "base")
    assert state.online.accept_length is not None and state.online.accept_length < 2.4
    assert max(left_out) > 0


async def test_a_whole_chat_s_sample_reads_as_a_stream_s_of_the_same_load() -> None:
    """A whole chat's time per token is its server's decode time (``meta_info``), a
    stream's the router's from its first byte to its end: at the same load, on emulators
    that keep their time, they agree (within 3% measured, at this scale and at real time;
    at 0.05, where the emulators' steps run late, they did not)."""
    flags = ("--time-scale", str(SCALE))
    async with (
        running_emulator("--mode", "spec", *flags) as spec,
        running_emulator("--mode", "base", *flags) as base,
        running_router(spec=[spec], base=[base], crossover=2.5) as (url, state),
    ):
        await until(lambda: all(b.gives_meta_info for b in state.roster.backends))  # SGLang

        async def whole() -> None:
            await client(url).chat.completions.create(model="m", messages=CHAT, max_tokens=32)

        streams: list[Sample] = []
        wholes: list[Sample] = []
        for _ in range(3):  # four at once each: both pools (past 2.5), at loads near 4
            for taken, one in ((streams, partial(streamed, url, False, None, 32)), (wholes, whole)):
                before = len(state.online.samples.window(time.monotonic()))
                await asyncio.gather(*(one() for _ in range(4)))
                taken += state.online.samples.window(time.monotonic())[before:]
    assert len(streams) == len(wholes) == 12
    for pool in ("spec", "base"):
        mine = statistics.median([s.tpot for s in wholes if s.pool == pool])
        theirs = statistics.median([s.tpot for s in streams if s.pool == pool])
        assert 0.85 < mine / theirs < 1.15, (pool, mine, theirs)


async def test_a_fit_leaves_the_event_loop_free(backends: tuple[str, str]) -> None:
    """The same fit, once on the loop as it ran before and once as the router's task makes
    it: the loop's longest wait while it runs is a fraction of the fit, not all of it."""
    spec, base = backends
    async with running_router(
        spec=[spec], base=[base], online_window_samples=2048, crossover=64
    ) as (
        _,
        state,
    ):
        rng, now = random.Random(7), time.monotonic()
        for i in range(100_000):
            pool: Pool = "spec" if i % 2 else "base"
            load = 2 ** rng.uniform(0, 9)
            tpot = 0.01 * (1 + load / (50 if pool == "spec" else 200)) * rng.uniform(0.9, 1.1)
            state.online.record(Sample(now - 100 + i * 1e-3, pool, load, tpot, 1000))
        began = time.perf_counter()
        state.online.refit(time.monotonic(), state.in_force.profile, shared=True)
        held = time.perf_counter() - began  # the loop's wait: this test's own code ran
        state.online.record(Sample(time.monotonic(), "base", 4.0, 0.01, 1000))  # a new window
        fitted_before = state.online.fitted_at
        previous = sys.getswitchinterval()
        short_turns()
        gaps: list[float] = []
        done = asyncio.Event()

        async def tick() -> None:
            last = time.perf_counter()
            while not done.is_set():
                await asyncio.sleep(0.001)
                gaps.append(time.perf_counter() - last)
                last = time.perf_counter()

        # a collection of the whole heap stops every thread, fit or no fit (and in a long
        # test process it is the longest pause there is): this measures the fit's own hold
        gc.collect()
        gc.disable()
        ticking = asyncio.create_task(tick())
        try:
            await asyncio.sleep(0.02)
            await fit_now(state)
            done.set()
            await ticking
        finally:
            gc.enable()
            sys.setswitchinterval(previous)
    assert state.online.fitted_at is not None and state.online.fitted_at != fitted_before
    assert state.online.fits[0].samples > 10_000
    assert held > 0.03, f"a fit of {held * 1e3:.0f} ms is too light to tell"
    assert max(gaps) < held / 2, (
        f"the loop waited {max(gaps) * 1e3:.0f} ms; the fit holds it {held * 1e3:.0f}"
    )
