"""Several workers learn as one: ``specroute serve --workers 2 --online adopt`` in front of
two emulators, the official openai client on one kept-alive connection to each worker. The
samples both workers take reach the leader's fit, and both show it and route by it; either
answers a peer replica's pull with both workers' samples."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2  # the openai client's own HTTP client
import openai

from specroute import prometheus
from specroute.emulator.predict import as_profile, predict
from specroute.loadgen.spawn import spawned
from specroute.model_flags import config_from_flags
from tests.emulators import running_emulator
from tests.router.online.test_online_live import KIMI, SCALE

WORKERS = 2
ADMIN = "admin-key-for-the-test"
PROFILED, LIVE = "3.0", "1.6"  # the accept length profiled, and the one served


def profile_paying_at_one(path: Path) -> Path:
    """Kimi-K2.5's predicted curves at accept length 3.0, at the servers' time scale, with
    speculation dearer from two requests up (a crossover of 1.5): served at accept length
    1.6, it pays nowhere, which requests at load 1 alone can show."""
    config = config_from_flags((*KIMI, "--accept-length", PROFILED), "spec")
    document: dict[str, Any] = as_profile(predict(config, [1, 2, 4, 8], 128, 128), config)
    for row in document["levels"]:
        for pool in ("spec", "base"):
            row[pool]["tpot_ms"]["median"] *= SCALE
        if row["concurrency"] > 1:
            row["spec"]["tpot_ms"]["median"] = row["base"]["tpot_ms"]["median"] * 1.3
    document["crossover"] = {"value": 1.5, "ci": [1.0, 2.0], "metric": "tpot"}
    path.write_text(json.dumps(document))
    return path


@asynccontextmanager
async def pinned(url: str) -> AsyncIterator[dict[int, httpx2.AsyncClient]]:
    """A client for each worker, on one kept-alive connection that the kernel gave it."""
    async with AsyncExitStack() as stack:
        found: dict[int, httpx2.AsyncClient] = {}
        for _ in range(100):
            http = httpx2.AsyncClient(limits=httpx2.Limits(max_connections=1), timeout=30)
            stack.push_async_callback(http.aclose)
            worker = (await status(http, url))["worker"]["index"]
            found.setdefault(worker, http)
            if len(found) == WORKERS:
                yield found
                return
        raise AssertionError(f"only workers {sorted(found)} answered")


async def status(http: httpx2.AsyncClient, url: str) -> dict[str, Any]:
    answer: dict[str, Any] = (await http.get(f"{url}/router/status")).json()
    return answer


async def served_by(http: httpx2.AsyncClient, url: str) -> str:
    """One streamed request that reports its usage (a sample); the pool that served it."""
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", http_client=http)
    raw = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=[{"role": "user", "content": "say something"}],
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for _ in raw.parse():
        pass
    return raw.headers["x-specroute-backend"].split(":")[0]


async def test_two_workers_learn_one_crossover_and_both_route_by_it(tmp_path: Path) -> None:
    timing = ("--time-scale", str(SCALE), "--stream-interval", "4")
    async with (
        running_emulator("--mode", "spec", *KIMI, *timing, "--accept-length", LIVE) as spec,
        running_emulator("--mode", "base", *KIMI, *timing) as base,
        spawned(
            "serve",
            "--spec",
            spec,
            "--base",
            base,
            "--profile",
            str(profile_paying_at_one(tmp_path / "profile.json")),
            "--workers",
            str(WORKERS),
            "--online",
            "adopt",
            "--online-interval",
            "0.2",
            "--online-min-samples",
            "8",
            "--online-explore-share",  # the plain server seen at load 1 too, in seconds:
            "0.5",  # a crossover is never adopted past the levels where both were seen
            "--admin-key",
            ADMIN,
        ) as router,
        pinned(router.url) as clients,
    ):
        url = router.url
        pools: dict[int, list[str]] = {w: [] for w in clients}
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # one request at a time: each joins load 1
            for w, http in clients.items():
                pools[w].append(await served_by(http, url))
            seen = [(await status(http, url)) for http in clients.values()]
            assert [s["worker"]["index"] for s in seen] == list(clients)  # still pinned
            if all(s["online"]["adopted_crossover"] is not None for s in seen):
                break
        assert all(p[0] == "spec" for p in pools.values()), pools  # by the profile: 1 <= 1.5
        total = sum(len(p) for p in pools.values())
        for _ in range(50):  # the leader's next fit takes in the last samples, both read it
            seen = [(await status(http, url))["online"] for http in clients.values()]
            if all(s["samples"] == s["fits"][0]["samples"] == total for s in seen):
                break
            await asyncio.sleep(0.1)
        one, another = seen
        assert one["samples"] == another["samples"] == total, (seen, total)  # both workers'
        assert one["adopted_crossover"] == another["adopted_crossover"] == 0.0  # pays nowhere
        assert one["fits"] == another["fits"] and one["fits"][0]["samples"] == total
        live = []  # the live profile, from the leader's fit whichever worker writes it
        for http in clients.values():
            answer = await http.get(
                f"{url}/router/profile/live", headers={"Authorization": f"Bearer {ADMIN}"}
            )
            assert answer.status_code == 200, answer.text
            document = answer.json()
            document.pop("created", None)
            document["measurement"].pop("fitted_seconds_ago")
            live.append(document)
        assert live[0] == live[1] and live[0]["measurement"]["samples_kept"] == total
        pulled = []  # a peer replica's pull: any worker answers, from every worker's rings
        admin = {"Authorization": f"Bearer {ADMIN}"}
        for http in clients.values():
            answer = await http.get(f"{url}/router/online/samples", headers=admin)
            assert answer.status_code == 200, answer.text
            pulled.append(answer.json())
        assert pulled[0]["epoch"] == pulled[1]["epoch"]
        assert len(pulled[0]["samples"]) == len(pulled[1]["samples"]) == total
        for http in clients.values():  # one worker's cursor reads in the other
            after = {"after": pulled[0]["next"]}
            answer = await http.get(f"{url}/router/online/samples", headers=admin, params=after)
            assert answer.json()["samples"] == []
        for http in clients.values():  # the live crossover in both: load 1 to the plain server
            assert await served_by(http, url) == "base"
            text = (await http.get(f"{url}/metrics")).text
            gauges = prometheus.sums(
                text,
                ("specroute_online_adopted", "specroute_crossover", "specroute_online_samples"),
            )
            assert gauges["specroute_online_adopted"] == 1 and gauges["specroute_crossover"] == 0
            assert total <= gauges["specroute_online_samples"] <= total + WORKERS  # not summed
