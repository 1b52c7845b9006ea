"""An adaptive speculative server's draft depth (SGLang's ``sglang:spec_num_steps``, which
``--speculative-adaptive`` moves with the batch) as the router reads it: each backend's in
``/router/status`` and in ``specroute_backend_spec_depth``, beside a server that keeps its
depth fixed, and whether each adapts it (its ``/server_info``)."""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
from aiohttp import web

from specroute import prometheus
from specroute.emulator.server import create_app
from specroute.router.tasks.online_fits import drafting_now
from tests.apps import serving
from tests.emulators import FAST, emulator_config, running_emulator
from tests.routers import running_router

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}


async def test_the_router_shows_each_speculative_server_s_depth_now(tmp_path: Path) -> None:
    schedule = tmp_path / "adaptive.json"  # depth 0 at every batch: drafting nothing
    schedule.write_text(json.dumps({"1": {"candidate_steps": [0], "warmup_batches": 0}}))
    adaptive = ("--mode", "spec", *FAST, "--speculative-adaptive")
    async with AsyncExitStack() as stack:
        zero = await stack.enter_async_context(
            running_emulator(*adaptive, "--speculative-adaptive-config", str(schedule))
        )
        fixed = await stack.enter_async_context(running_emulator("--mode", "spec", *FAST))
        base = await stack.enter_async_context(running_emulator("--mode", "base", *FAST))
        url, state = await stack.enter_async_context(
            running_router(
                spec=[zero, fixed], base=[base], given_params={"crossover": 8}, poll_interval=0.1
            )
        )
        async with aiohttp.ClientSession() as s:
            for server in (zero, fixed):  # a request each: their depth is set by a batch
                async with s.post(f"{server}/v1/chat/completions", json=CHAT) as r:
                    assert r.status == 200
            for _ in range(100):
                async with s.get(f"{url}/router/status") as r:
                    backends = (await r.json())["backends"]
                shown = {b["url"]: b["spec_depth"] for b in backends}
                adapts = {b["url"]: b["adaptive"] for b in backends}
                if shown[zero] == 0 and shown[fixed]:  # read after the batch that set it
                    break
                await asyncio.sleep(0.1)
            async with s.get(f"{url}/metrics") as r:
                text = await r.text()
            # two speculative servers at different depths: the pool has no one accept length
            # that a sample may be compared with
            assert drafting_now(state) == (None, None)
            stream = CHAT | {"stream": True, "max_tokens": 16}
            async with s.post(f"{url}/v1/chat/completions", json=stream) as r:
                served_by = r.headers["x-specroute-backend"]
                assert b"[DONE]" in await r.read()
            for _ in range(50):
                if kept := state.online.samples.window(time.monotonic()):
                    break
                await asyncio.sleep(0.05)
        depth_of = {f"spec:{u.removeprefix('http://')}": shown[u] for u in (zero, fixed)}
        assert kept[-1].depth == depth_of[served_by]  # the sample carries its server's depth
    assert shown[zero] == 0 and shown[fixed] is not None and shown[fixed] >= 1, shown
    # whether each adapts its depth, from its /server_info; the plain server is not asked
    assert adapts == {zero: True, fixed: False, base: None}, adapts
    exported = {
        sample.labels["backend"]: sample.value
        for sample in prometheus.samples(text, ["specroute_backend_spec_depth"])
    }
    assert exported[f"spec:{zero.removeprefix('http://')}"] == 0
    assert exported[f"spec:{fixed.removeprefix('http://')}"] == shown[fixed]


async def test_a_server_started_again_adaptive_is_read_again() -> None:
    """A speculative server that stops answering and comes back on its address, now with
    ``--speculative-adaptive``: the router asks its ``/server_info`` again and shows it
    adaptive, as it showed it fixed before."""
    first = web.AppRunner(create_app(emulator_config("--mode", "spec", *FAST)))
    await first.setup()
    await web.TCPSite(first, "127.0.0.1", 0).start()
    port = first.addresses[0][1]
    spec = f"http://127.0.0.1:{port}"
    adaptive = create_app(emulator_config("--mode", "spec", *FAST, "--speculative-adaptive"))
    async with (
        running_emulator("--mode", "base", *FAST) as base,
        running_router(
            spec=[spec], base=[base], given_params={"crossover": 8}, poll_interval=0.05
        ) as (url, _),
    ):
        try:
            assert await _adaptive_shown(url, spec) is False
        finally:
            await first.cleanup()
        await _adaptive_shown(url, spec, until=None)  # its poll finds nobody there
        async with serving(adaptive, port=port):
            assert await _adaptive_shown(url, spec, until=True) is True


async def _adaptive_shown(url: str, server: str, until: bool | None = False) -> bool | None:
    """``server``'s ``adaptive`` in the router's status once it reads ``until``, or at the
    last of 100 tries."""
    async with aiohttp.ClientSession() as s:
        for _ in range(100):
            async with s.get(f"{url}/router/status") as r:
                backends = (await r.json())["backends"]
            shown: bool | None = next(b["adaptive"] for b in backends if b["url"] == server)
            if shown is until:
                break
            await asyncio.sleep(0.05)
    return shown
