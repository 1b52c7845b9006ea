"""Injected faults as a client sees them, each driven against the emulator directly."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletion

from specroute.cli import main
from specroute.emulator.faults import CRASH_EXIT_STATUS, Fault, FaultError, parse_faults
from specroute.loadgen.spawn import spawned
from tests.emulator.test_emulator_api import CHAT, client
from tests.emulators import running_emulator

FAST = ("--time-scale", "0.05")
STREAM = {"messages": CHAT, "max_tokens": 10, "ignore_eos": True, "stream": True}
ANSWER = {"messages": CHAT, "max_tokens": 10, "ignore_eos": True}


async def _ask(url: str) -> ChatCompletion:
    """Ten tokens through the official client."""
    async with client(url) as c:
        return await c.chat.completions.create(
            model="m", messages=CHAT, max_tokens=10, extra_body={"ignore_eos": True}
        )


@pytest.mark.parametrize(
    ("spec", "fault"),
    [
        ("refuse", Fault("refuse")),
        ("status:500,probability=0.25,count=3", Fault("status", 500, probability=0.25, count=3)),
        ("stall_first", Fault("stall_first", seconds=None)),
        ("stall_first:0.3", Fault("stall_first", seconds=0.3)),
        ("stall_mid:2, seconds=1.5", Fault("stall_mid", after=2, seconds=1.5)),
        ("cut_mid:4,mid_event=true", Fault("cut_mid", after=4, mid_event=True)),
        ("crash", Fault("crash")),
        ("crash:3", Fault("crash", after=3)),
        ("slow:2.5", Fault("slow", factor=2.5)),
        ("compress,count=1", Fault("compress", count=1)),
    ],
)
def test_specs(spec: str, fault: Fault) -> None:
    assert parse_faults([spec]) == (fault,)
    assert parse_faults([fault.describe()]) == (fault,)  # what GET shows, POST takes back


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("bogus", "unknown fault kind 'bogus' (one of: refuse, status,"),
        ("status:200", "fault 'status': status must be an HTTP error status (400-599), got '200'"),
        ("status:abc", "fault 'status': status must be an HTTP error status"),
        ("stall_first:-1", "fault 'stall_first': seconds must be a positive number of seconds"),
        (
            "stall_mid:2,secs=1",
            "fault 'stall_mid': unknown key 'secs' (it takes after, seconds, probability, count)",
        ),
        ("stall_mid:x", "fault 'stall_mid': after must be a whole number of SSE events"),
        ("refuse:3", "fault 'refuse' takes no value"),
        ("slow", "fault 'slow': give its factor"),
        ("slow:2,probability=0.5", "fault 'slow': unknown key 'probability' (it takes factor)"),
        ("status,probability=2", "fault 'status': probability must be a number in (0, 1], got '2'"),
        ("compress,count=0", "fault 'compress': count must be a whole number, 1 or more"),
        ("cut_mid:1,mid_event=maybe", "fault 'cut_mid': mid_event must be true or false"),
        ("status;status:500", "fault 'status' is given twice"),
        ("status,count", "fault 'status': expected KEY=VALUE, got 'count'"),
    ],
)
def test_bad_specs_name_the_fault_and_the_key(spec: str, said: str) -> None:
    with pytest.raises(FaultError) as error:
        parse_faults([spec])
    assert said in str(error.value)


def test_the_cli_refuses_a_bad_fault_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["emulate", "--mode", "spec", "--fault", "refuse", "--fault", "stall_mid:2,secs=1"])
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("specroute emulate: fault 'stall_mid': unknown key 'secs'")
    assert "Traceback" not in err


async def _faults(s: aiohttp.ClientSession, url: str, method: str = "GET", **body: Any) -> Any:
    async with s.request(method, f"{url}/emulator/faults", json=body or None) as r:
        return r.status, await r.json()


async def _injected(url: str, kind: str) -> float:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    line = f'specroute_emulator_faults_total{{kind="{kind}"}} '
    return sum(float(x.removeprefix(line)) for x in text.splitlines() if x.startswith(line))


async def _timed_events(r: aiohttp.ClientResponse) -> list[tuple[float, str]]:
    """Each SSE event's text and when it came, until the stream ends or breaks."""
    events = []
    try:
        async for line in r.content:
            if line.startswith(b"data: "):
                events.append((time.monotonic(), line.decode().strip().removeprefix("data: ")))
    except aiohttp.ClientPayloadError:
        pass
    return events


async def _raw(r: aiohttp.ClientResponse) -> tuple[bytes, bool]:
    """The body's bytes as they came, and whether it broke before its end."""
    received = b""
    try:
        async for chunk in r.content.iter_any():
            received += chunk
    except aiohttp.ClientPayloadError:
        return received, True
    return received, False


async def _drain(stream: openai.AsyncStream[Any]) -> None:
    async for _ in stream:
        pass


async def test_faults_are_set_shown_and_cleared_at_run_time() -> None:
    async with running_emulator("--mode", "base", *FAST) as url, aiohttp.ClientSession() as s:
        assert await _faults(s, url) == (200, {"faults": [], "seed": 0})
        status, shown = await _faults(
            s,
            url,
            "POST",
            faults=[
                "status:500",
                {"kind": "stall_mid", "after": 2, "probability": 0.5, "count": 3},
            ],
            seed=7,
        )
        assert status == 200 and shown == {
            "seed": 7,
            "faults": [
                {"kind": "status", "status": 500, "probability": 1.0, "count": None},
                {
                    "kind": "stall_mid",
                    "after": 2,
                    "seconds": None,
                    "probability": 0.5,
                    "count": 3,
                    "remaining": 3,
                },
            ],
        }
        assert await _faults(s, url) == (200, shown)
        with pytest.raises(openai.InternalServerError):
            await _ask(url)
        assert await _faults(s, url, "POST", faults=[]) == (200, {"faults": [], "seed": 7})
        await _ask(url)
        await _faults(s, url, "POST", faults=["status"])
        assert await _faults(s, url, "DELETE") == (200, {"faults": [], "seed": 7})
        await _ask(url)

        status, error = await _faults(s, url, "POST", faults=[{"kind": "stall_mid", "secs": 1}])
        assert status == 400 and error == {
            "object": "error",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
            "message": "fault 'stall_mid': unknown key 'secs' (it takes after, seconds, "
            "probability, count)",
        }
        status, error = await _faults(s, url, "POST", fault=["status"])
        assert status == 400 and "unknown field(s): fault" in error["message"]
        assert await _faults(s, url) == (200, {"faults": [], "seed": 7})


async def test_with_an_api_key_the_admin_endpoint_needs_it_and_probes_do_not() -> None:
    async with (
        running_emulator("--mode", "base", *FAST, "--api-key", "k", "--fault", "slow:2") as url,
        aiohttp.ClientSession() as s,
    ):
        async with s.get(f"{url}/emulator/faults") as r:
            assert r.status == 401
        async with s.delete(f"{url}/emulator/faults") as r:
            assert r.status == 401
        async with s.get(f"{url}/emulator/faults", headers={"Authorization": "Bearer k"}) as r:
            assert r.status == 200 and (await r.json())["faults"] == [
                {"kind": "slow", "factor": 2.0}
            ]
        async with s.get(f"{url}/health") as r:
            assert r.status == 200


async def test_refuse_drops_every_connection_health_included_until_lifted() -> None:
    async with running_emulator("--mode", "base", *FAST, "--fault", "refuse") as url:
        async with aiohttp.ClientSession() as s:
            with pytest.raises(aiohttp.ClientConnectionError):
                await s.post(f"{url}/v1/chat/completions", json=ANSWER)
            with pytest.raises(aiohttp.ClientConnectionError):
                await s.get(f"{url}/health")
        with pytest.raises(openai.APIConnectionError):
            await _ask(url)
        async with aiohttp.ClientSession() as s:  # the admin endpoint still answers
            assert (await _faults(s, url, "DELETE"))[0] == 200
            async with s.get(f"{url}/health") as r:
                assert r.status == 200
        await _ask(url)
        assert await _injected(url, "refuse") >= 3  # aiohttp tries a GET again on a reset


async def test_status_answers_with_sglangs_error_body() -> None:
    async with running_emulator("--mode", "spec", *FAST, "--fault", "status:500") as url:
        with pytest.raises(openai.InternalServerError) as error:
            await _ask(url)
        assert error.value.status_code == 500
        assert error.value.body == {
            "object": "error",
            "type": "INTERNAL_SERVER_ERROR",
            "param": None,
            "code": 500,
            "message": "The emulator injected this error (fault 'status', HTTP 500).",
        }
        body = {"text": "hi", "sampling_params": {"max_new_tokens": 4}}
        async with aiohttp.ClientSession() as s, s.post(f"{url}/generate", json=body) as r:
            assert r.status == 500 and (await r.json())["code"] == 500
            async with s.get(f"{url}/v1/models") as models:  # not a generation endpoint
                assert models.status == 200
        assert await _injected(url, "status") == 2


async def test_stall_first_sends_a_streams_headers_then_nothing_for_a_while() -> None:
    async with (
        running_emulator("--mode", "spec", *FAST, "--fault", "stall_first:0.5") as url,
        aiohttp.ClientSession() as s,
    ):
        start = time.monotonic()
        async with s.post(f"{url}/v1/chat/completions", json=STREAM) as r:
            headers_at = time.monotonic()
            assert r.content_type == "text/event-stream"
            events = await _timed_events(r)
        assert headers_at - start < 0.4
        assert events[0][0] - start >= 0.48 and events[-1][1] == "[DONE]"
        start = time.monotonic()
        async with s.post(f"{url}/v1/chat/completions", json=ANSWER) as r:
            answer = await r.json()
        assert time.monotonic() - start >= 0.48
        assert answer["usage"]["completion_tokens"] == 10
        assert await _injected(url, "stall_first") == 2


async def test_stall_mid_pauses_after_k_events_and_then_finishes() -> None:
    async with (
        running_emulator("--mode", "base", *FAST, "--fault", "stall_mid:3,seconds=0.5") as url,
        aiohttp.ClientSession() as s,
        s.post(
            f"{url}/v1/completions",
            json={"prompt": "hi", "max_tokens": 10, "ignore_eos": True, "stream": True},
        ) as r,
    ):
        events = await _timed_events(r)
    gaps = [b[0] - a[0] for a, b in itertools.pairwise(events)]
    assert gaps[2] >= 0.48 and max(gaps[:2] + gaps[3:]) < 0.3
    assert events[-1][1] == "[DONE]" and len(events) == 11  # ten tokens, whole


async def test_cut_mid_closes_after_k_events() -> None:
    async with (
        running_emulator("--mode", "spec", *FAST, "--fault", "cut_mid:3") as url,
        aiohttp.ClientSession() as s,
        s.post(f"{url}/v1/chat/completions", json=STREAM) as r,
    ):
        assert r.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await r.read()
        async with client(url) as c:
            stream = await c.chat.completions.create(
                model="m", messages=CHAT, max_tokens=10, stream=True
            )
            with pytest.raises(openai.APIConnectionError):  # as the openai client sees it
                await _drain(stream)


async def test_cut_mid_event_leaves_half_an_event() -> None:
    body = {"text": "hi", "sampling_params": {"max_new_tokens": 10}, "stream": True}
    async with (
        running_emulator("--mode", "base", *FAST, "--fault", "cut_mid:2,mid_event=true") as url,
        aiohttp.ClientSession() as s,
        s.post(f"{url}/generate", json=body) as r,
    ):
        received, broken = await _raw(r)
    *whole, half = received.split(b"\n\n")
    assert broken and len(whole) == 2
    assert all(json.loads(event.removeprefix(b"data: ")) for event in whole)
    assert half.startswith(b"data: {") and not half.endswith(b"}")


async def test_crash_exits_the_process_after_k_events_or_at_once() -> None:
    async with (
        spawned("emulate", "--mode", "spec", *FAST, "--fault", "crash:2") as mid,
        spawned("emulate", "--mode", "base", *FAST, "--fault", "crash") as first,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(f"{mid.url}/v1/chat/completions", json=STREAM) as r:
            events = await _timed_events(r)
        with pytest.raises(aiohttp.ClientConnectionError):
            await s.post(f"{first.url}/v1/chat/completions", json=ANSWER)
        for server in (mid, first):
            assert await asyncio.wait_for(server.process.wait(), 10) == CRASH_EXIT_STATUS
            assert "fault 'crash'" in server.said()
    assert len(events) == 2


async def test_slow_makes_every_step_longer_and_the_answer_whole() -> None:
    body = {"prompt": "hi", "max_tokens": 40, "ignore_eos": True}

    async def timed(s: aiohttp.ClientSession, url: str) -> float:
        start = time.monotonic()
        async with s.post(f"{url}/v1/completions", json=body) as r:
            assert (await r.json())["usage"]["completion_tokens"] == 40
        return time.monotonic() - start

    async with (
        running_emulator("--mode", "base", "--time-scale", "0.2") as url,
        aiohttp.ClientSession() as s,
    ):
        normal = await timed(s, url)
        await _faults(s, url, "POST", faults=["slow:4"])
        slowed = await timed(s, url)
        await _faults(s, url, "DELETE")
        again = await timed(s, url)
    assert 2.5 < slowed / normal < 6 and again / normal < 1.5


async def test_compress_gzips_answers_and_streams_event_by_event() -> None:
    faults = ("--fault", "compress", "--fault", "stall_mid:3,seconds=0.6")
    async with (
        running_emulator("--mode", "spec", *FAST, *faults) as url,
        aiohttp.ClientSession() as s,
    ):
        async with s.post(f"{url}/v1/chat/completions", json=ANSWER) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert (await r.json())["usage"]["completion_tokens"] == 10
        start = time.monotonic()
        async with s.post(f"{url}/v1/chat/completions", json=STREAM) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            events = await _timed_events(r)
        assert events[2][0] - start < 0.4  # flushed as written, not held to the end
        assert events[-1][1] == "[DONE]" and json.loads(events[1][1])["choices"]
        identity = {"Accept-Encoding": "identity"}
        async with s.post(f"{url}/v1/chat/completions", json=ANSWER, headers=identity) as r:
            assert "Content-Encoding" not in r.headers
        answer = await _ask(url)
        assert answer.usage is not None and answer.usage.completion_tokens == 10
        assert await _injected(url, "compress") == 3


async def test_count_and_probability_pick_requests_reproducibly() -> None:
    async def statuses(s: aiohttp.ClientSession, url: str, n: int) -> list[int]:
        seen = []
        for _ in range(n):
            async with s.post(f"{url}/v1/chat/completions", json={**ANSWER, "max_tokens": 1}) as r:
                seen.append(r.status)
        return seen

    async with running_emulator("--mode", "base", *FAST) as url, aiohttp.ClientSession() as s:
        await _faults(s, url, "POST", faults=["status:503,count=2", "cut_mid:1,count=1"])
        assert await statuses(s, url, 3) == [503, 503, 200]
        # the stream-only fault waits for a stream: none of those counted against it
        assert (await _faults(s, url))[1]["faults"] == [
            {
                "kind": "cut_mid",
                "after": 1,
                "mid_event": False,
                "probability": 1.0,
                "count": 1,
                "remaining": 1,
            }
        ]
        patterns = []
        for _ in range(2):
            await _faults(s, url, "POST", faults=["status:500,probability=0.5"], seed=3)
            patterns.append(await statuses(s, url, 16))
        assert patterns[0] == patterns[1] and 2 < patterns[0].count(500) < 14
