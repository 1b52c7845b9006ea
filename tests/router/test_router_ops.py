"""Running the router: keys, live profile swaps, a backend dying mid-stream, SIGTERM drain,
and the metrics' values."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from specroute.emulator.predict import as_profile, predict
from specroute.policies.view import RequestInfo
from specroute.router.app import build_state
from specroute.router.settings import RouterSettings
from tests.emulator.test_emulator_api import CHAT, client, metric
from tests.emulators import FAST, emulator_config, running_emulator
from tests.processes import specroute
from tests.router.proxy.test_router import LONG_STREAM, settled
from tests.routers import running_router


def profile(value: float, hours_old: float = 0.0) -> dict[str, Any]:
    created = datetime.now(UTC) - timedelta(hours=hours_old)
    return {
        "schema": "specroute.profile/v1",
        "created": created.isoformat(),
        "crossover": {"value": value, "ci": [value * 0.9, value * 1.1]},
    }


def keyed(url: str, key: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


async def test_client_and_admin_keys(caplog: pytest.LogCaptureFixture) -> None:
    secrets = ("client-key-1", "admin-key-2", "backend-key-3")
    async with (
        running_emulator("--mode", "spec", *FAST, "--api-key", secrets[2]) as spec,
        running_emulator("--mode", "base", *FAST, "--api-key", secrets[2]) as base,
        running_router(
            spec=[spec],
            base=[base],
            crossover=4,
            api_keys=[secrets[0]],
            admin_key=secrets[1],
            backend_api_key=secrets[2],
        ) as (url, _),
        aiohttp.ClientSession() as s,
    ):
        with pytest.raises(openai.AuthenticationError):
            await keyed(url, "wrong").chat.completions.create(model="m", messages=CHAT)
        async with s.get(f"{url}/v1/models") as r:
            assert r.status == 401
            assert (await r.json())["error"]["type"] == "authentication_error"
        for key in secrets[:2]:  # the admin key serves too
            raw = await keyed(url, key).chat.completions.with_raw_response.create(
                model="m", messages=CHAT, max_tokens=3
            )
            assert raw.http_response.status_code == 200  # so the backend got its own key
            assert secrets[2] not in str(raw.headers) + raw.http_response.text
            assert (await keyed(url, key).models.list()).data  # backend key on /v1/models
        for path in ("/health", "/ready", "/health_generate", "/metrics"):
            async with s.get(url + path) as r:
                assert r.status == 200  # probes and scrapers need no key
        post = f"{url}/router/profile"
        for headers, status in [
            ({}, 401),
            ({"Authorization": f"Bearer {secrets[0]}"}, 403),
            ({"Authorization": f"Bearer {secrets[1]}"}, 200),
        ]:
            async with s.post(post, json=profile(3), headers=headers) as r:
                assert r.status == status
        auth = {"Authorization": f"Bearer {secrets[0]}"}
        async with s.get(f"{url}/router/status", headers=auth) as r:
            shown = await r.text() + await (await s.get(f"{url}/metrics")).text()
    assert not any(key in shown + caplog.text for key in secrets)


@pytest.mark.parametrize(
    "keys", [{}, {"api_keys": ["client-key"]}], ids=["no keys", "client keys only"]
)
async def test_without_an_admin_key_routing_cannot_be_changed(keys: dict[str, Any]) -> None:
    """Fail closed: no admin key configured means no one may swap the profile, with or
    without a client key, and the routing stays as it was."""
    async with (
        running_router(
            spec=["http://127.0.0.1:9"], base=["http://127.0.0.1:9"], crossover=4, **keys
        ) as (url, state),
        aiohttp.ClientSession() as s,
    ):
        for headers in ({}, {"Authorization": "Bearer client-key"}):
            async with s.post(f"{url}/router/profile", json=profile(0), headers=headers) as r:
                assert r.status == 403
                error = (await r.json())["error"]
                assert error["type"] == "permission_error" and "admin key" in error["message"]
        assert state.in_force.policy.describe()["crossover"] == 4


async def test_profile_swaps_live_without_dropping_streams(tmp_path: Path) -> None:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile(1, hours_old=2)))
    admin = {"Authorization": "Bearer admin-key"}
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.2") as spec,
        running_emulator("--mode", "base", "--time-scale", "0.2") as base,
        running_router(spec=[spec], base=[base], profile=path, admin_key="admin-key") as (
            url,
            state,
        ),
        aiohttp.ClientSession(headers=admin) as s,
    ):
        async with s.get(f"{url}/router/status") as r:
            status = await r.json()
        assert status["profile"]["source"] == str(path)
        assert status["profile"]["age_seconds"] == pytest.approx(7200, abs=60)
        assert status["policy"]["parameters"]["crossover"] == 1
        streams = [await s.post(f"{url}/v1/chat/completions", json=LONG_STREAM) for _ in range(3)]
        assert [r.headers["x-specroute-backend"][:4] for r in streams] == ["spec", "base", "base"]

        async with s.post(f"{url}/router/profile", data=b"{bad") as r:
            assert r.status == 400 and "not loaded" in (await r.json())["error"]["message"]
        async with s.post(f"{url}/router/profile", json={"schema": "other"}) as r:
            assert r.status == 400 and "schema" in (await r.json())["error"]["message"]
        # a refused profile changes nothing
        assert state.in_force.policy.describe()["crossover"] == 1

        async with s.post(f"{url}/router/profile", json=profile(100)) as r:
            assert r.status == 200
            assert (await r.json())["policy"]["parameters"]["crossover"] == 100
        assert state.inflight() == 3  # nothing in flight was touched
        raw = await client(url).chat.completions.with_raw_response.create(
            model="m", messages=CHAT, max_tokens=2
        )
        assert raw.headers["x-specroute-backend"].startswith("spec:")
        for r in streams:  # every stream that began before the swap ends normally
            body = (await r.read()).decode()
            assert body.rstrip().endswith("data: [DONE]") and '"error"' not in body
        assert await metric(url, "specroute_crossover") == 100
        async with s.get(f"{url}/router/status") as r:
            status = await r.json()
        assert status["profile"]["source"] == "POST /router/profile"
        assert status["profile"]["age_seconds"] < 60


async def test_backend_killed_mid_stream_ends_with_an_error_event() -> None:
    async with (
        specroute("emulate", "--mode", "spec", "--time-scale", "0.5") as (spec, process),
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=8, health_interval=0.1) as (
            url,
            state,
        ),
    ):
        stream = await client(url).chat.completions.create(
            model="m", messages=CHAT, max_tokens=2000, stream=True, extra_body={"ignore_eos": True}
        )
        received = 0

        async def read_until_killed() -> None:
            nonlocal received
            async for chunk in stream:
                received += bool(chunk.choices and chunk.choices[0].delta.content)
                if received == 3:
                    process.kill()

        with pytest.raises(openai.APIError, match=r"failed mid-stream .*incomplete"):
            await read_until_killed()
        assert received >= 3
        await settled(state)
        assert state.inflight() == 0
        assert await metric(url, "specroute_upstream_errors_total") >= 1
        for _ in range(50):  # the health check notices; new work fails over
            if not state.roster.backends[0].healthy:
                break
            await asyncio.sleep(0.1)
        raw = await client(url).chat.completions.with_raw_response.create(
            model="m", messages=CHAT, max_tokens=3
        )
        assert raw.headers["x-specroute-backend"].startswith("base:")
        assert state.decisions.recent[-1]["reason"] == "failover"


@asynccontextmanager
async def hanging_up_after(*chunks: bytes) -> AsyncIterator[str]:
    """A backend that passes its health checks but answers every POST with a stream's
    headers and ``chunks`` (each sent as one HTTP chunk), then hangs up mid-answer."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).lower()
        length = head.partition(b"content-length:")[2].split(b"\r\n")[0]
        await reader.readexactly(int(length or 0))  # all of it: an unread body resets
        if head.startswith(b"get /health"):
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        else:
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            for chunk in chunks:
                writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    async with server:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_a_stream_broken_mid_event_ends_with_a_whole_error_event() -> None:
    whole = json.dumps(
        {
            "id": "c1",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": "m",
            "choices": [
                {"index": 0, "delta": {"role": "assistant", "content": "Hi"}, "finish_reason": None}
            ],
        }
    ).encode()
    async with (
        hanging_up_after(b"data: " + whole + b"\n\n", b'data: {"choices": [{"del') as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=8) as (url, state),
    ):
        stream = await client(url).chat.completions.create(
            model="m", messages=CHAT, max_tokens=4, stream=True
        )
        got: list[str | None] = []

        async def read() -> None:
            async for chunk in stream:
                got.append(chunk.choices[0].delta.content)

        with pytest.raises(openai.APIError, match=r"failed mid-stream .*incomplete"):
            await read()
        assert got == ["Hi"]  # the whole event came through, the half one did not
        await settled(state)
        assert state.inflight() == 0


async def test_an_answer_broken_before_its_first_byte_is_retried_and_counted_once() -> None:
    async with (
        hanging_up_after() as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=8) as (url, state),
        aiohttp.ClientSession() as s,
    ):
        assert state.roster.backends[0].healthy
        stream = await client(url).chat.completions.create(
            model="m", messages=CHAT, max_tokens=4, stream=True
        )
        assert [c async for c in stream]  # whole, from the plain pool
        await settled(state)
        async with s.get(f"{url}/metrics") as r:
            text = await r.text()
    names = {b.pool: b.name for b in state.roster.backends}
    assert samples(text, "specroute_upstream_errors_total") == {
        (("backend", names["spec"]), ("kind", "midstream")): 1
    }
    assert samples(text, "specroute_requests_total") == {
        (("backend", names["base"]), ("pool", "base"), ("status", "200")): 1
    }
    assert [d["reason"] for d in state.decisions.recent] == ["below_crossover", "retry"]


def test_recent_decisions_keeps_as_many_as_set() -> None:
    assert (
        RouterSettings(spec=["http://s:1"], base=["http://b:2"]).observability.recent_decisions
        == 50
    )
    given: dict[str, Any] = {"spec": ["http://s:1"], "base": ["http://b:2"], "crossover": 4}
    state = build_state(RouterSettings(**given, recent_decisions=2))
    for _ in range(3):
        decision = state.in_force.policy.choose(RequestInfo("/generate"), state.view())
        state.decisions.record(decision, 0)
    assert len(state.decisions.recent) == 2


async def _stream_text(response: aiohttp.ClientResponse) -> str:
    return (await response.read()).decode()


@pytest.mark.parametrize(("drain_timeout", "finishes"), [(30, True), (0.5, False)])
async def test_sigterm_drains_in_flight_streams(drain_timeout: float, finishes: bool) -> None:
    async with running_emulator("--mode", "base", "--time-scale", "0.5") as base:
        async with (
            specroute(
                "serve",
                "--spec",
                base,
                "--base",
                base,
                "--policy",
                "always-base",
                "--drain-grace",
                "1",
                "--drain-timeout",
                str(drain_timeout),
            ) as (
                url,
                process,
            ),
            aiohttp.ClientSession() as s,
        ):
            body = {**LONG_STREAM, "max_tokens": 600, "stream_options": {"include_usage": True}}
            short = {"model": "m", "messages": CHAT, "max_tokens": 2}
            response = await s.post(f"{url}/v1/chat/completions", json=body)
            await response.content.readline()
            process.send_signal(signal.SIGTERM)
            signalled = time.monotonic()
            reading = asyncio.create_task(_stream_text(response))
            await asyncio.sleep(0.2)
            async with s.get(f"{url}/ready") as r:
                assert r.status == 503  # at once: load balancers take the router out
            async with s.post(f"{url}/v1/chat/completions", json=short) as r:
                assert r.status == 200  # while they do, requests are still served
            await asyncio.sleep(max(0.0, signalled + 1.3 - time.monotonic()))
            async with s.post(f"{url}/v1/chat/completions", json=body) as r:
                assert r.status == 503  # after the grace, new ones are refused
                assert "shutting down" in (await r.json())["error"]["message"]
            text = await reading
            await asyncio.wait_for(process.wait(), 15)
            stopped = time.monotonic() - signalled
        assert process.returncode == 0
        if finishes:
            assert '"completion_tokens":600' in text.replace(" ", "")
            assert text.rstrip().endswith("data: [DONE]")
        else:
            assert stopped < 1 + drain_timeout + 3
            assert '"completion_tokens":600' not in text.replace(" ", "")
            assert "shutting down" in text  # cut off with a reason, not silently


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """A metric's samples by their sorted labels, read with Prometheus' own parser."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


async def test_metrics_have_the_right_values() -> None:
    async with (
        running_emulator("--mode", "spec", "--time-scale", "0.5", "--accept-length", "3") as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(spec=[spec], base=[base], crossover=1, poll_interval=0.1) as (url, state),
        aiohttp.ClientSession() as s,
    ):
        names = {b.pool: b.name for b in state.roster.backends}
        long = await s.post(f"{url}/v1/chat/completions", json={**LONG_STREAM, "max_tokens": 600})
        for _ in range(3):  # one running on spec: these go to base
            await client(url).chat.completions.create(model="m", messages=CHAT, max_tokens=4)
        await asyncio.sleep(0.4)  # a few polls while spec is busy
        async with s.get(f"{url}/metrics") as r:
            busy = await r.text()
        await long.read()
        await settled(state)
        await asyncio.sleep(0.3)
        async with s.get(f"{url}/metrics") as r:
            text = await r.text()

    def one(name: str, **labels: str) -> float:
        return samples(text, name)[tuple(sorted(labels.items()))]

    assert one("specroute_requests_total", pool="spec", backend=names["spec"], status="200") == 1
    assert one("specroute_requests_total", pool="base", backend=names["base"], status="200") == 3
    assert one("specroute_route_decisions_total", pool="spec", reason="below_crossover") == 1
    assert one("specroute_route_decisions_total", pool="base", reason="above_crossover") == 3
    assert one("specroute_inflight", pool="spec", backend=names["spec"]) == 0
    assert samples(busy, "specroute_inflight")[(("backend", names["spec"]), ("pool", "spec"))] == 1
    assert samples(busy, "specroute_live_concurrency")[()] == 1  # the long stream
    assert one("specroute_live_concurrency") == 0  # now, not at the last decision
    assert one("specroute_crossover") == 1
    for pool in ("spec", "base"):
        assert one("specroute_backend_healthy", backend=names[pool]) == 1
        assert one("specroute_ttft_seconds_count", pool=pool) == (1 if pool == "spec" else 3)
        assert one("specroute_request_duration_seconds_count", pool=pool) == (
            1 if pool == "spec" else 3
        )
    assert samples(busy, "specroute_backend_running")[(("backend", names["spec"]),)] == 1
    assert one("specroute_backend_running", backend=names["spec"]) == 0
    assert one("specroute_backend_queued", backend=names["base"]) == 0
    assert one("specroute_backend_accept_length", backend=names["spec"]) == pytest.approx(
        3, abs=0.5
    )
    assert (("backend", names["base"]),) not in samples(text, "specroute_backend_accept_length")
    assert one("specroute_ttft_seconds_sum", pool="spec") < one(
        "specroute_request_duration_seconds_sum", pool="spec"
    )


def kimi_predicted(tmp_path: Path) -> tuple[dict[str, Any], Path]:
    """Kimi's profile as the emulator's model predicts it, and the file it is written to."""
    config = emulator_config(
        "--hardware", "kimi-k2.5-8x-pcie-fitted", "--max-running-requests", "64"
    )
    predicted = as_profile(predict(config, [1, 2, 4, 6, 8, 12], 128, 64), config)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(predicted))
    return predicted, path


async def test_crossover_gauge_follows_live_acceptance(tmp_path: Path) -> None:
    """``acceptance-crossover`` behind the router: when the speculative server's drafter
    gets worse, the accept length the router reads from its gauge falls, and so does
    the threshold it routes by and shows as ``specroute_crossover``."""
    predicted, path = kimi_predicted(tmp_path)
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(
            spec=[spec], base=[base], policy="acceptance-crossover", profile=path, poll_interval=0.1
        ) as (url, _),
        aiohttp.ClientSession() as s,
    ):

        async def shown_after_traffic() -> float:
            for _ in range(8):  # one at a time: every poll window sees finished requests
                await client(url).chat.completions.create(
                    model="m", messages=CHAT, max_tokens=32, extra_body={"ignore_eos": True}
                )
            await asyncio.sleep(0.3)  # a poll after the last of them
            await client(url).chat.completions.create(model="m", messages=CHAT, max_tokens=1)
            return await metric(url, "specroute_crossover")

        before = await shown_after_traffic()
        async with s.post(f"{spec}/emulator/acceptance", json={"accept_length": 2.1}) as r:
            assert r.status == 200
        after = await shown_after_traffic()
    # before: the profile's threshold or above (these short requests count the prefill's
    # token in the counters' accept length, which reads a little high against the profile)
    assert before >= 0.9 * predicted["crossover"]["value"]
    assert after < 2  # at 2.1 it pays, if at all, for a request alone (82 against 90 tok/s)


async def test_a_pool_shunned_for_its_acceptance_is_probed_and_comes_back(
    tmp_path: Path,
) -> None:
    """The drafter gets so bad that speculation pays at no load: ``acceptance-crossover``
    stops sending there, so only probes keep its accept length measured. When the drafter
    recovers, the probes see it and speculation resumes."""
    predicted, path = kimi_predicted(tmp_path)
    async with (
        running_emulator("--mode", "spec", *FAST) as spec,
        running_emulator("--mode", "base", *FAST) as base,
        running_router(
            spec=[spec],
            base=[base],
            policy="acceptance-crossover",
            profile=path,
            poll_interval=0.1,
            probe_share=0.25,
        ) as (url, state),
        aiohttp.ClientSession() as s,
    ):

        async def traffic_at(accept_length: float) -> list[str]:
            async with s.post(
                f"{spec}/emulator/acceptance", json={"accept_length": accept_length}
            ) as r:
                assert r.status == 200
            pools = []
            for _ in range(16):  # one at a time, so each poll window sees finished ones
                raw = await client(url).chat.completions.with_raw_response.create(
                    model="m", messages=CHAT, max_tokens=32, extra_body={"ignore_eos": True}
                )
                pools.append(raw.headers["x-specroute-backend"].split(":")[0])
                await asyncio.sleep(0.05)
            return pools

        await traffic_at(1.2)
        shunned = await traffic_at(1.2)
        assert state.in_force.policy.crossover() == 0  # at 1.2, speculation pays at no load
        assert 2 <= shunned.count("spec") <= 6  # one in four, to keep measuring it
        recovered = await traffic_at(3.0)
        assert recovered[-4:] == ["spec"] * 4  # the probes saw the drafter recover
        assert state.in_force.policy.crossover() >= 0.9 * predicted["crossover"]["value"]


async def test_a_profile_without_a_crossover_is_said_and_shown(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Speculation paid at every level measured: the router routes by the last one, and
    says so in the log, the status page and a metric."""
    path = tmp_path / "profile.json"
    bound = {"value": None, "ci": None, "bound": "above", "limit": 16}
    path.write_text(json.dumps(profile(1) | {"crossover": bound}))
    backends = {"spec": ["http://127.0.0.1:9"], "base": ["http://127.0.0.1:9"]}
    async with (
        running_router(**backends, profile=path) as (url, _),
        aiohttp.ClientSession() as s,
    ):
        async with s.get(f"{url}/router/status") as r:
            status = await r.json()
        assert "not past it" in status["profile"]["note"]
        assert status["policy"]["parameters"]["crossover"] == 16
        assert await metric(url, "specroute_crossover_measured") == 0
        assert await metric(url, "specroute_crossover") == 16
    assert "up to 16" in caplog.text
