"""``/server_info`` and ``/model_info`` (and SGLang's older names) through the router: a
healthy speculative server's answer first, then a plain one's, with every key hidden."""

from __future__ import annotations

from contextlib import AsyncExitStack

import aiohttp
import openai
import pytest
from aiohttp import web

from specroute import prometheus
from specroute.loadgen.spawn import free_port
from specroute.router.operator.server_info import HIDDEN, redacted
from tests.apps import serving
from tests.emulators import running_emulator
from tests.routers import running_router

BACKEND_KEY = "sk-backend-k3y-0f-the-servers"
CLIENT_KEY = "sk-client-k3y"
ADMIN_KEY = "sk-admin-k3y-0f-the-router"
FAST = ("--time-scale", "0.1")


@pytest.mark.parametrize("path", ["/server_info", "/get_server_info"])
async def test_server_info_is_the_speculative_servers_with_no_key_in_it(path: str) -> None:
    async with AsyncExitStack() as stack:
        keyed = ("--api-key", BACKEND_KEY, *FAST)
        spec = await stack.enter_async_context(running_emulator("--mode", "spec", *keyed))
        base = await stack.enter_async_context(running_emulator("--mode", "base", *keyed))
        url, _ = await stack.enter_async_context(
            running_router(
                spec=[spec],
                base=[base],
                given_params={"crossover": 8},
                backend_api_key=BACKEND_KEY,
                api_keys=[CLIENT_KEY],
                admin_key=ADMIN_KEY,
            )
        )
        async with aiohttp.ClientSession() as s:
            direct = await s.get(f"{spec}/server_info", headers=bearer(BACKEND_KEY))
            assert BACKEND_KEY in await direct.text()  # SGLang shows its keys: so does its twin
            chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 16}
            served = await s.post(
                f"{url}/v1/chat/completions", json=chat, headers=bearer(CLIENT_KEY)
            )
            assert served.headers["x-specroute-backend"].startswith("spec:")  # decoded there
            r = await s.get(f"{url}{path}", headers=bearer(CLIENT_KEY))
            text = await r.text()
            assert r.status == 200, text
            assert r.headers["x-specroute-backend"] == f"spec:{spec.removeprefix('http://')}"
            for key in (BACKEND_KEY, CLIENT_KEY, ADMIN_KEY):
                assert key not in text
            info = await r.json()
            assert info["api_key"] == HIDDEN and info["admin_api_key"] is None
            assert f"--api-key {HIDDEN}" in info["launch_command"]
            assert info["speculative_algorithm"] == "EAGLE3"
            assert info["internal_states"][0]["avg_spec_accept_length"] > 1  # bench_serving's
            refused = await s.get(f"{url}{path}")
            assert refused.status == 401  # as the serving paths: a client key


async def test_model_info_from_a_plain_server_when_no_speculative_one_is_healthy() -> None:
    dead = f"http://127.0.0.1:{free_port()}"  # never seen working: ejected at start
    async with AsyncExitStack() as stack:
        base = await stack.enter_async_context(running_emulator("--mode", "base", *FAST))
        url, _ = await stack.enter_async_context(
            running_router(spec=[dead], base=[base], given_params={"crossover": 8})
        )
        async with aiohttp.ClientSession() as s:
            for path in ("/model_info", "/get_model_info"):
                r = await s.get(f"{url}{path}")
                assert r.status == 200, await r.text()
                assert r.headers["x-specroute-backend"].startswith("base:")
                assert (await r.json())["is_generation"] is True


async def test_servers_that_refuse_are_a_502_that_names_each_and_none_healthy_a_503(
    caplog: pytest.LogCaptureFixture,
) -> None:
    keyed = ("--api-key", BACKEND_KEY, *FAST)  # its probes are open, /server_info not
    async with AsyncExitStack() as stack:
        spec = await stack.enter_async_context(running_emulator("--mode", "spec", *keyed))
        base = await stack.enter_async_context(running_emulator("--mode", "base", *keyed))
        url, _ = await stack.enter_async_context(
            running_router(spec=[spec], base=[base], given_params={"crossover": 8})
        )
        async with aiohttp.ClientSession() as s:
            r = await s.get(f"{url}/server_info")
            error = (await r.json())["error"]
            assert r.status == 502 and error["type"] == "upstream_error"
            for pool, server in (("spec", spec), ("base", base)):
                named = f"{pool}:{server.removeprefix('http://')}: /server_info answered 401"
                assert named in error["message"]
            assert await counted(url, "specroute_upstream_errors_total", kind="info") == 2
            logged = [r.getMessage() for r in caplog.records if r.name == "specroute.router"]
            assert sum("No answer to /server_info" in line for line in logged) == 2, logged
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    alone = running_router(spec=dead[:1], base=dead[1:], given_params={"crossover": 8})
    async with alone as (url, _), aiohttp.ClientSession() as s:
        r = await s.get(f"{url}/model_info")
        assert r.status == 503 and "Retry-After" in r.headers


async def test_answers_the_server_compressed_are_read_and_their_keys_hidden() -> None:
    """A server may compress an answer for a client that accepts gzip; the router's session
    leaves bodies as sent (its proxy relays them so), so what it reads it decodes itself:
    the server's info, and the model cards the openai client lists and retrieves."""
    card = {"id": "m", "object": "model", "created": 0, "owned_by": "sglang"}

    def zipped_json(body: object) -> web.Response:
        answer = web.json_response(body)
        answer.enable_compression(web.ContentCoding.gzip)
        return answer

    async def info(request: web.Request) -> web.Response:
        return zipped_json({"model_path": "m", "api_key": BACKEND_KEY})

    async def models(request: web.Request) -> web.Response:
        return zipped_json({"object": "list", "data": [card]})

    async def model(request: web.Request) -> web.Response:
        return zipped_json(card)

    async def health(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application()
    for path, handler in [
        ("/health", health),
        ("/server_info", info),
        ("/v1/models", models),
        ("/v1/models/m", model),
    ]:
        app.router.add_get(path, handler)
    async with AsyncExitStack() as stack:
        zipped = await stack.enter_async_context(serving(app))
        base = await stack.enter_async_context(running_emulator("--mode", "base", *FAST))
        url, _ = await stack.enter_async_context(
            running_router(spec=[zipped], base=[base], given_params={"crossover": 8})
        )
        async with aiohttp.ClientSession() as s:
            async with s.get(f"{zipped}/server_info") as direct:
                assert direct.headers["Content-Encoding"] == "gzip"  # what the router meets
            r = await s.get(f"{url}/server_info")
            assert r.status == 200, await r.text()
            assert r.headers["x-specroute-backend"].startswith("spec:")
            assert await r.json() == {"model_path": "m", "api_key": HIDDEN}
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0)
        assert "m" in [m.id for m in (await client.models.list()).data]
        assert (await client.models.retrieve("m")).id == "m"


def test_what_looks_like_a_secret_is_hidden_and_nothing_else() -> None:
    info = {
        "api_key": "a",
        "admin_api_key": None,
        "hf_token": "hf_x",
        "ssl_keyfile_password": "p",
        "watermark": {"keys": ["k1", "k2"]},
        "max_total_num_tokens": 4096,
        "bucket_time_to_first_token": [0.1, 0.5],  # SGLang's: a token named, not a secret
        "kt_max_deferred_experts_per_token": 4,
        "tokenizer_path": "m/tok",
        "launch_command": "sglang --hf-token=abc --api-key xyz --tokenizer-path m/tok",
        "note": "started by sk-held-by-the-router-123 at noon",
        "short": "k3y",
    }
    out = redacted(info, ["sk-held-by-the-router-123", "k3y"])
    assert out["api_key"] == out["hf_token"] == out["ssl_keyfile_password"] == HIDDEN
    assert out["admin_api_key"] is None  # no key set: nothing to hide, and it says so
    assert out["watermark"]["keys"] == [HIDDEN, HIDDEN]
    assert out["max_total_num_tokens"] == 4096 and out["tokenizer_path"] == "m/tok"
    assert out["bucket_time_to_first_token"] == [0.1, 0.5]
    assert out["kt_max_deferred_experts_per_token"] == 4
    assert out["launch_command"] == (
        f"sglang --hf-token={HIDDEN} --api-key {HIDDEN} --tokenizer-path m/tok"
    )
    assert out["note"] == f"started by {HIDDEN} at noon"
    assert out["short"] == HIDDEN  # a short key: hidden where it is the whole string


async def counted(url: str, name: str, **labels: str) -> float:
    """The router's samples of ``name`` whose labels include ``labels``, summed."""
    async with aiohttp.ClientSession() as s, s.get(f"{url}/metrics") as r:
        text = await r.text()
    found = prometheus.sums(text, {name}, lambda have: labels.items() <= have.items())
    return found.get(name, 0.0)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}
