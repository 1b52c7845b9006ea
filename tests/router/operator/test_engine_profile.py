"""``/start_profile`` and ``/stop_profile`` through the router: every server profiled,
each trace named after its server, or an answer that says which server failed."""

from __future__ import annotations

import asyncio
import gzip
import json
from pathlib import Path

import aiohttp
import pytest

from tests.emulators import FAST, running_emulator
from tests.router.operator.test_cache_flush import ADMIN_KEY, CLIENT_KEY, deployment
from tests.router.operator.test_server_info import bearer, counted


def _events(trace: Path) -> list[dict[str, object]]:
    events: list[dict[str, object]] = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    return events


async def test_one_profile_of_both_pools_a_trace_a_server(tmp_path: Path) -> None:
    out = tmp_path / "traces"
    async with deployment() as (url, servers), aiohttp.ClientSession() as s:
        asked = {"output_dir": str(out), "profile_id": "run1", "activities": ["CPU"]}
        async with s.post(f"{url}/start_profile", json=asked) as r:
            answer = await r.json()
            assert r.status == 200, answer
        assert answer["started"] is True
        assert sorted(x["pool"] for x in answer["servers"]) == ["base", "spec"]
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
        for server in servers:  # each server's own steps, whoever sent the work
            assert (await s.post(f"{server}/v1/chat/completions", json=chat)).status == 200
        assert not out.exists()  # nothing written before the stop
        async with s.get(f"{url}/stop_profile") as r:  # GET, as SGLang takes it too
            answer = await r.json()
            assert r.status == 200, answer
        assert answer["stopped"] is True
    names = sorted(p.name for p in out.iterdir())
    spec_name, base_name = (s.removeprefix("http://").replace(":", "-") for s in servers)
    assert names == sorted(
        [f"spec-{spec_name}-run1-TP-0.trace.json.gz", f"base-{base_name}-run1-TP-0.trace.json.gz"]
    )  # one profile_id given, and still a file a server
    for name in names:
        assert {e["name"] for e in _events(out / name)} == {"prefill", "decode"}  # its steps


async def test_a_second_start_fails_on_every_server_and_says_so() -> None:
    async with deployment() as (url, _), aiohttp.ClientSession() as s:
        assert (await s.post(f"{url}/start_profile")).status == 200
        again = await s.post(f"{url}/start_profile")
        answer = await again.json()
        assert again.status == 502 and answer["started"] is False
        assert answer["error"]["message"].startswith("The profile start failed on 2 of 2")
        assert [x["status"] for x in answer["servers"]] == [500, 500]
        assert await counted(url, "specroute_upstream_errors_total", kind="profile") == 2
        assert (await s.post(f"{url}/stop_profile")).status == 200  # the first one's
        none = await s.post(f"{url}/stop_profile")
        assert none.status == 502 and (await none.json())["stopped"] is False


@pytest.mark.parametrize(
    ("body", "param"),
    [(b"{not json", None), (b"[1]", None), (b'{"profile_prefix": 5}', "profile_prefix")],
)
async def test_a_body_that_is_not_a_profile_request_is_a_400(
    body: bytes, param: str | None
) -> None:
    async with deployment() as (url, _), aiohttp.ClientSession() as s:
        headers = {"Content-Type": "application/json"}
        r = await s.post(f"{url}/start_profile", data=body, headers=headers)
        error = (await r.json())["error"]
        assert r.status == 400 and error["param"] == param, error
        assert (await s.post(f"{url}/stop_profile")).status == 502  # none was started
        none = await s.post(f"{url}/start_profile", data=b"null", headers=headers)
        assert none.status == 200  # no profile request: SGLang's defaults
        assert (await s.post(f"{url}/stop_profile")).status == 200


async def test_the_admin_key_where_one_is_configured() -> None:
    keyed = deployment(api_keys=[CLIENT_KEY], admin_key=ADMIN_KEY)
    async with keyed as (url, _), aiohttp.ClientSession() as s:
        for path in ("/start_profile", "/stop_profile"):
            assert (await s.post(f"{url}{path}")).status == 401
            assert (await s.post(f"{url}{path}", headers=bearer(CLIENT_KEY))).status == 403
        started = await s.post(f"{url}/start_profile", headers=bearer(ADMIN_KEY))
        await asyncio.sleep(0.05)
        stopped = await s.post(f"{url}/stop_profile", headers=bearer(ADMIN_KEY))
        assert (started.status, stopped.status) == (200, 200)


async def test_the_emulator_ends_a_profile_of_num_steps_by_itself(tmp_path: Path) -> None:
    """As SGLang's profiler: with ``num_steps`` the trace is written after that many steps,
    and a stop then finds none running."""
    async with running_emulator("--mode", "base", *FAST) as server, aiohttp.ClientSession() as s:
        asked = {"output_dir": str(tmp_path), "num_steps": 3, "profile_prefix": "p"}
        assert (await s.post(f"{server}/start_profile", json=asked)).status == 200
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
        assert (await s.post(f"{server}/v1/chat/completions", json=chat)).status == 200
        assert (await s.post(f"{server}/stop_profile")).status == 500
        bad = await s.post(f"{server}/start_profile", json={"num_steps": "3"})
        assert bad.status == 400
    (trace,) = await asyncio.to_thread(lambda: list(tmp_path.iterdir()))
    assert trace.name.startswith("p-") and trace.name.endswith("-TP-0.trace.json.gz")
    assert len(_events(trace)) == 3
