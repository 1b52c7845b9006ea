"""Beyond one pair: several servers per pool, GPU groups, router replicas that agree, and
servers that join and leave while the router runs (emulators on loopback)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specroute.bench.replicas import ramp
from specroute.router.backends.discovery import Discovery, DiscoveryError, read_targets
from specroute.router.state import RouterState
from specroute.server_metrics import BackendStats, parse, parse_loads, with_loads
from tests.emulator.test_emulator_api import metric
from tests.emulators import running_emulator
from tests.router.proxy.test_router import LONG_STREAM, settled
from tests.routers import running_router

FAST = ("--time-scale", "0.05")


@pytest.fixture
async def two_pairs() -> AsyncIterator[tuple[list[str], list[str]]]:
    async with AsyncExitStack() as stack:
        urls = [
            await stack.enter_async_context(running_emulator("--mode", mode, *FAST))
            for mode in ("spec", "spec", "base", "base")
        ]
        yield urls[:2], urls[2:]


HELD = {**LONG_STREAM, "max_tokens": 20_000}  # seconds at FAST: open while the rest open


async def held(url: str, n: int) -> list[str]:
    """Open ``n`` long streams one after another, each held open; the backend of each."""
    async with aiohttp.ClientSession() as s:
        answers = []
        for _ in range(n):
            answers.append(await s.post(f"{url}/v1/chat/completions", json=HELD))
        for r in answers:
            r.close()
    return [r.headers["x-specroute-backend"] for r in answers]


def pools(backends: list[str]) -> list[str]:
    return [b.split(":")[0] for b in backends]


@pytest.mark.parametrize("topology", ["partitioned", "shared"])
async def test_two_pairs_route_as_one_pair_at_half_the_load(
    two_pairs: tuple[list[str], list[str]], topology: str
) -> None:
    """The crossover is one server's (or one GPU group's): two pairs speculate up to twice
    its load, each server as one pair would at half the load."""
    spec, base = two_pairs
    groups = [[spec[0], base[0]], [spec[1], base[1]]] if topology == "shared" else []
    crossover = dict(crossover=3, topology=topology)
    async with running_router(spec=spec, base=base, groups=groups, **crossover) as (url, state):
        two = await held(url, 12)
        await settled(state)
    async with running_router(spec=spec[:1], base=base[:1], **crossover) as (url, state):
        one = await held(url, 6)
        await settled(state)
    assert pools(one) == ["spec"] * 3 + ["base"] * 3
    assert pools(two) == [pools(one)[k // 2] for k in range(12)]
    for pool in ("spec", "base"):  # within a pool, the least loaded: evenly
        served = [b for b in two if b.startswith(pool)]
        assert len(set(served)) == 2 and served.count(served[0]) == 3, served
    if topology == "shared":  # the plain request goes to the GPUs of the group it joins
        by_port = {u.rsplit(":", 1)[1]: i for i, u in enumerate(spec + base)}
        group_of = [by_port[b.rsplit(":", 1)[1]] % 2 for b in two]
        assert group_of == [0, 1] * 6


REPLICA_TOLERANCE = 0.15  # absolute difference of the speculative share, README "Replicas"


async def test_replicas_agree_with_one_router() -> None:
    """Two replicas reading the servers' load (``/v1/loads``) plus what each sent since
    send as much to speculation as one router does; counting only their own in-flight
    requests, they speculate up to twice the crossover."""
    levels, seconds = (1, 2, 4, 6, 8, 10), 0.6
    common = dict(crossover=4, poll_interval=0.05, health_interval=5.0)
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.3") as spec,
        running_emulator("--mode", "base", "--time-scale", "0.3") as base,
    ):
        pair = dict(spec=[spec], base=[base], **common)
        async with running_router(**pair) as (one, _):
            alone = (await ramp([one], levels, seconds)).share
        async with (
            running_router(**pair, concurrency_source="replicas") as (a, _),
            running_router(**pair, concurrency_source="replicas") as (b, _),
        ):
            agreeing = (await ramp([a, b], levels, seconds)).share
        async with running_router(**pair) as (a, _), running_router(**pair) as (b, _):
            apart = (await ramp([a, b], levels, seconds)).share
    assert abs(agreeing - alone) <= REPLICA_TOLERANCE, (alone, agreeing, apart)
    assert apart - alone > REPLICA_TOLERANCE, (alone, agreeing, apart)  # what it fixes


def test_loads_are_read_over_data_parallel_ranks() -> None:
    rank = {
        "num_running_reqs": 3,
        "num_waiting_reqs": 1,
        "max_running_requests": 48,
        "num_used_tokens": 900,
        "max_total_num_tokens": 4096,
    }
    read = parse_loads({"loads": [rank, rank]})
    assert read == BackendStats(6.0, 2.0, max_running=96.0, used_tokens=1800, max_tokens=8192)
    some = parse_loads({"loads": [rank, rank | {"max_running_requests": None}]})
    assert some is not None and (some.running, some.queued, some.max_running) == (6, 2, None)
    # the loads' figures in place of the gauges, the gauges' KV figures where the loads had none
    scraped = parse(
        'sglang:num_running_reqs{tp_rank="0"} 9\nsglang:num_queue_reqs{tp_rank="0"} 9\n'
        'sglang:num_used_tokens{tp_rank="0"} 700\nsglang:max_total_num_tokens{tp_rank="0"} 4096\n'
    )
    assert (scraped.used_tokens, scraped.max_tokens) == (700, 4096)
    merged = with_loads(scraped, read)
    assert (merged.running, merged.queued, merged.used_tokens, merged.max_tokens) == (
        6,
        2,
        1800,
        8192,
    )
    older = {k: v for k, v in rank.items() if "tokens" not in k}  # loads without the KV figures
    merged = with_loads(scraped, parse_loads({"loads": [older]}) or BackendStats())
    assert (merged.running, merged.used_tokens, merged.max_tokens) == (3, 700, 4096)
    bad: object
    for bad in ({}, {"loads": []}, {"loads": [rank | {"num_running_reqs": -1}]}, [rank]):
        assert parse_loads(bad) is None, bad


async def test_the_load_comes_from_v1_loads() -> None:
    """With ``/v1/loads`` the reading is the server's count at the poll, capacity too."""
    async with (
        running_emulator("--mode", "spec", "--max-running-requests", "2") as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(
            spec=[spec], base=[base], crossover=8, poll_interval=0.05, concurrency_source="backend"
        ) as (_, state),
        aiohttp.ClientSession() as s,
    ):
        streams = [await s.post(f"{spec}/v1/chat/completions", json=LONG_STREAM) for _ in range(3)]
        await asyncio.sleep(0.3)
        seen = {b.name.split(":")[0]: b for b in state.view().backends}
        for r in streams:
            r.close()
    assert (seen["spec"].running, seen["spec"].queued) == (2, 1)
    assert seen["spec"].max_running_requests == 2


def write_targets(path: Path, spec: list[str], base: list[str]) -> None:
    def group(urls: list[str], pool: str) -> dict[str, Any]:
        return {"targets": [u.removeprefix("http://") for u in urls], "labels": {"pool": pool}}

    text = json.dumps([group(spec, "spec"), group(base, "base")])
    staged = path.with_suffix(".new")
    staged.write_text(text)
    staged.replace(path)


async def until(state: RouterState, names: set[str], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while {b.name for b in state.roster.backends} != names:
        assert time.monotonic() < deadline, sorted(b.name for b in state.roster.backends)
        await asyncio.sleep(0.05)


def named(pool: str, url: str) -> str:
    return f"{pool}:{url.removeprefix('http://')}"


async def test_servers_join_and_leave_from_a_watched_file(
    two_pairs: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """A server leaves: no new request goes there, and its requests in flight finish whole;
    one joins: it gets traffic; a broken file changes nothing, and says so."""
    spec, base = two_pairs
    targets = tmp_path / "targets.json"
    write_targets(targets, spec[:1], base[:1])
    async with (
        running_router(backends_file=targets, watch_interval=0.1, crossover=8) as (url, state),
        aiohttp.ClientSession() as s,
    ):
        names = {b.name for b in state.roster.backends}
        assert names == {named("spec", spec[0]), named("base", base[0])}
        leaving = await s.post(f"{url}/v1/chat/completions", json=LONG_STREAM)
        assert leaving.headers["x-specroute-backend"] == named("spec", spec[0])
        write_targets(targets, spec[1:], base)
        await until(state, {named("spec", spec[1]), *(named("base", u) for u in base)})
        async with s.post(f"{url}/v1/chat/completions", json=LONG_STREAM) as joined:
            assert joined.headers["x-specroute-backend"] == named("spec", spec[1])
        text = await leaving.text()  # the one that left finishes its answer, whole
        assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text
        targets.write_text("[{")
        await asyncio.sleep(0.3)
        assert len(state.roster.backends) == 3
        assert await metric(url, "specroute_watch_failures_total") >= 1
        await settled(state)
        assert state.board.inflight(0) == 0  # the column of the server that left


async def test_a_bad_backends_file_stops_the_start(tmp_path: Path) -> None:
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps([{"targets": ["a:1"], "labels": {"pool": "fast"}}]))
    with pytest.raises(DiscoveryError, match="pool must be spec or base"):
        async with running_router(backends_file=targets, crossover=8):
            pass


def test_targets_file_form() -> None:
    doc = [
        {"targets": ["10.0.0.1:30000", "https://h:443"], "labels": {"pool": "spec", "group": "g1"}},
        {"targets": ["10.0.0.2:30000"], "labels": {"pool": "base"}},
    ]
    servers = read_targets(json.dumps(doc), "f")
    assert [(s.url, s.pool, s.group) for s in servers] == [
        ("http://10.0.0.1:30000", "spec", "g1"),
        ("https://h:443", "spec", "g1"),
        ("http://10.0.0.2:30000", "base", ""),
    ]
    for bad in ("{}", '[{"targets": ["nohost"], "labels": {"pool": "spec"}}]', "[1]"):
        with pytest.raises(DiscoveryError):
            read_targets(bad, "f")


async def test_names_resolve_to_every_address_and_a_failure_keeps_them() -> None:
    answers: list[list[str] | OSError] = [["10.0.0.2", "10.0.0.1"], ["10.0.0.3"], OSError("no")]
    failed: list[str] = []

    async def resolve(host: str, port: int) -> list[str]:
        assert (host, port) == ("sglang-spec.llm.svc", 30000)
        answer = answers.pop(0)
        if isinstance(answer, OSError):
            raise answer
        return answer

    discovery = Discovery(
        [], [("dns+http://sglang-spec.llm.svc:30000", "spec")], None, failed.append, resolve
    )
    urls = [[s.url for s in await discovery.servers()] for _ in range(3)]
    assert urls == [
        ["http://10.0.0.2:30000", "http://10.0.0.1:30000"],
        ["http://10.0.0.3:30000"],
        ["http://10.0.0.3:30000"],  # the resolver failed: the last answer stays
    ]
    assert failed == ["dns"]


async def test_a_name_is_resolved_by_the_system(two_pairs: tuple[list[str], list[str]]) -> None:
    spec, base = two_pairs
    port = spec[0].rsplit(":", 1)[1]
    async with running_router(
        spec=[f"dns+http://localhost:{port}"], base=base[:1], crossover=8
    ) as (url, state):
        assert named("spec", spec[0]) in {b.name for b in state.roster.backends}
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{url}/v1/chat/completions", json={**LONG_STREAM, "max_tokens": 4}) as r,
        ):
            assert r.status == 200 and r.headers["x-specroute-backend"].startswith("spec:")


async def test_the_profile_file_is_watched(
    two_pairs: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    spec, base = two_pairs
    profile = tmp_path / "profile.json"
    document = {"schema": "specroute.profile/v1", "crossover": {"value": 4, "ci": [3, 5]}}
    profile.write_text(json.dumps(document))
    async with running_router(
        spec=spec[:1], base=base[:1], profile=profile, watch_interval=0.1
    ) as (url, state):
        assert state.in_force.policy.crossover() == 4
        document["crossover"] = {"value": 9, "ci": [8, 10]}
        profile.write_text(json.dumps(document))
        await asyncio.sleep(0.4)
        assert state.in_force.policy.crossover() == 9
        assert await metric(url, "specroute_crossover") == 9
        profile.write_text('{"schema": "specroute.profile/v1"}')  # no crossover: refused
        await asyncio.sleep(0.4)
        assert state.in_force.policy.crossover() == 9
        assert await metric(url, "specroute_watch_failures_total") == 1
