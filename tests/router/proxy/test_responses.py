"""The Responses API through the router, with the official client: a request routed by
load like a chat, its usage read for the online samples, and what goes on from a stored
response (SGLang's ``--enable-response-store``) sent to the server that holds it, whatever
the load; a response no server holds, or that a server could not be asked for, says so."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import aiohttp
import openai
import pytest

from specroute import prometheus
from specroute.loadgen.spawn import free_port
from specroute.router.backends.flight import usage
from specroute.router.backends.response_owners import Owners
from specroute.router.proxy.request import request_info
from specroute.router.state import RouterState
from tests.emulators import running_emulator
from tests.router.proxy.test_router import LONG_STREAM
from tests.routers import running_router

FAST = ("--time-scale", "0.1")
STORE = "--enable-response-store"
MODEL = "moonshotai/Kimi-K2.5"  # the emulator's default: the only model it serves


@asynccontextmanager
async def two_speculative(*flags: str) -> AsyncIterator[tuple[str, RouterState]]:
    """A router whose speculative pool is two servers (least load), and a plain one."""
    async with AsyncExitStack() as stack:
        servers = [
            await stack.enter_async_context(running_emulator("--mode", mode, *FAST, *flags))
            for mode in ("spec", "spec", "base")
        ]
        yield await stack.enter_async_context(
            running_router(
                spec=servers[:2],
                base=servers[2:],
                given_params={"crossover": 64},
                concurrency_source="max",  # what other clients run there counts too
                poll_interval=0.1,
            )
        )


def _client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


async def _counted(url: str, name: str, **labels: str) -> float:
    """A counter of the router's, summed over the label sets that have ``labels``."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    kept = prometheus.sums(text, [name], lambda found: labels.items() <= found.items())
    return kept.get(name, 0.0)


def test_the_servers_remembered_are_the_most_recent_few() -> None:
    owners = Owners(size=2)
    owners.put("resp_a", "spec:a")
    owners.put("resp_b", "spec:b")
    assert owners.get("resp_a") == "spec:a"  # used: the most recent now
    owners.put("resp_c", "base:c")
    assert (owners.get("resp_a"), owners.get("resp_b"), owners.get("resp_c")) == (
        "spec:a",
        None,
        "base:c",
    )


def test_a_responses_request_is_read_as_the_chat_it_is() -> None:
    body = {"instructions": "be brief", "input": "héllo", "max_output_tokens": 5, "stream": True}
    info = request_info("/v1/responses", body)
    assert (info.prompt_bytes, info.max_tokens, info.stream) == (8 + 6, 5, True)
    items = [{"role": "user", "content": [{"type": "input_text", "text": "abc"}]}]
    assert request_info("/v1/responses", {"input": items}).prompt_bytes == 3
    assert request_info("/v1/responses", {"input": 7}).prompt_bytes == 0  # the server's 400
    completed = b'"usage":{"input_tokens":12,"input_tokens_details":{},"output_tokens":9}'
    assert usage((b"", completed)) == {"prompt_tokens": 12, "completion_tokens": 9}


async def test_a_response_is_routed_by_load_and_its_stream_makes_a_sample() -> None:
    async with two_speculative() as (url, state), _client(url) as client:
        raw = await client.responses.with_raw_response.create(
            model=MODEL, input="hello", instructions="be brief", max_output_tokens=8
        )
        answer = raw.parse()
        assert raw.headers["x-specroute-backend"].startswith("spec:")
        assert answer.status == "incomplete" and answer.output_text  # cut at its limit
        assert answer.usage is not None and answer.usage.output_tokens == 8 - 2  # SGLang's room
        kept = state.online.kept()
        kinds = []
        stream = await client.responses.create(
            model=MODEL, input="hello", max_output_tokens=6, stream=True
        )
        async for event in stream:
            kinds.append(event.type)
            if event.type == "response.incomplete":  # its end, cut at max_output_tokens
                assert event.response.usage is not None
                assert event.response.usage.output_tokens == 6 - 2
        assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"
        assert "response.output_text.delta" in kinds
        for _ in range(40):  # its tokens counted, as a chat stream's: one sample more
            if state.online.kept() > kept:
                break
            await asyncio.sleep(0.05)
        assert state.online.kept() == kept + 1
        # without the store, going on from a response, or asking for it, is the servers' 400
        with pytest.raises(openai.BadRequestError, match="store is disabled"):
            await client.responses.create(
                model=MODEL, input="more", previous_response_id=answer.id, max_output_tokens=4
            )
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.retrieve(answer.id)
        said = refused.value.body["message"]  # type: ignore[index]
        assert said.startswith("The servers refused to look for it: Response store is disabled")


async def test_what_goes_on_from_a_stored_response_reaches_its_server_whatever_the_load() -> None:
    async with two_speculative(STORE) as (url, state), _client(url) as client:
        first = await client.responses.with_raw_response.create(
            model=MODEL, input="hello", max_output_tokens=4
        )
        holder = first.headers["x-specroute-backend"]
        response_id = first.parse().id
        by_name = {b.name: b for b in state.roster.backends}
        other = next(n for n, b in by_name.items() if b.pool == "spec" and n != holder)
        async with aiohttp.ClientSession() as s:
            # the holder busy with another client's streams: by load, the next goes elsewhere
            target = f"{by_name[holder].url}/v1/chat/completions"
            streams = [await s.post(target, json=LONG_STREAM) for _ in range(3)]
            try:
                for _ in range(100):
                    busy = {b.name: b.load(state.view().source) for b in state.view().backends}
                    if busy[holder] >= 3:
                        break
                    await asyncio.sleep(0.05)
                assert busy[holder] >= 3 > busy[other], busy
                turns = []
                for _ in range(2):  # found by asking every server, then remembered
                    raw = await client.responses.with_raw_response.create(
                        model=MODEL,
                        input="and then?",
                        previous_response_id=response_id,
                        max_output_tokens=4,
                    )
                    turns.append(raw.headers["x-specroute-backend"])
                    response_id = raw.parse().id
                    usage_seen = raw.parse().usage
                new = await client.responses.with_raw_response.create(
                    model=MODEL, input="a new conversation", max_output_tokens=4
                )
            finally:
                for stream in streams:
                    stream.close()
        assert turns == [holder, holder]
        assert new.headers["x-specroute-backend"] == other  # by load, as before
        assert usage_seen is not None and usage_seen.input_tokens > 20  # the turns before it
        stored = await _counted(url, "specroute_route_decisions_total", reason="stored")
        assert stored == 2
        fetched = await client.responses.with_raw_response.retrieve(response_id)
        assert fetched.headers["x-specroute-backend"] == holder
        assert fetched.parse().id == response_id and fetched.parse().status == "incomplete"
        cancelled = await client.responses.cancel(response_id)
        assert cancelled.status == "incomplete"  # ended already: a cancel changes nothing
        with pytest.raises(openai.NotFoundError) as missing:
            await client.responses.create(
                model=MODEL, input="x", previous_response_id="resp_nowhere", max_output_tokens=2
            )
        assert missing.value.body["param"] == "previous_response_id"  # type: ignore[index]
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve("resp_nowhere")


async def test_a_response_cancelled_through_the_router_stops_at_its_server() -> None:
    async with two_speculative(STORE) as (url, _), _client(url) as client:
        stream = await client.responses.create(
            model=MODEL, input="a long answer", max_output_tokens=4000, stream=True
        )
        events = aiter(stream)
        created = await anext(events)
        assert created.type == "response.created"
        cancelled = await client.responses.cancel(created.response.id)
        rest = [event.type async for event in events]
    assert cancelled.status == "cancelled"
    assert rest[-1] == "response.failed"  # it ended there, short of its 4,000 tokens
    assert rest.count("response.output_text.delta") < 3998


async def test_a_response_that_a_server_could_not_be_asked_for_is_a_502_naming_it() -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    async with AsyncExitStack() as stack:
        live = await stack.enter_async_context(running_emulator("--mode", "spec", *FAST, STORE))
        url, _ = await stack.enter_async_context(
            running_router(spec=[live], base=[dead], given_params={"crossover": 64})
        )
        async with _client(url) as client:
            with pytest.raises(openai.APIStatusError) as failed:
                await client.responses.retrieve("resp_elsewhere")
            with pytest.raises(openai.APIStatusError) as going_on:
                await client.responses.create(
                    model=MODEL, input="x", previous_response_id="resp_elsewhere"
                )
        counted = await _counted(url, "specroute_upstream_errors_total", kind="responses")
    for error in (failed.value, going_on.value):
        assert error.status_code == 502, error.message
        assert dead.removeprefix("http://") in error.message  # named
    assert counted == 2
