"""``/openapi.json``: the router's own answers described by the models its handlers build
them with, so that what a live router answers is what the document says, path by path."""

from __future__ import annotations

import json
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
import jsonschema  # type: ignore[import-untyped]
import pytest

from specroute.router.operator.openapi import document
from specroute.router.protocol.errors import error_json
from specroute.router.protocol.request_id import enter, leave
from tests.emulators import running_emulator
from tests.routers import running_router

FAST = ("--time-scale", "0.1")
ADMIN = "admin-k3y-for-the-test"
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": True}


def _validator(path: str, method: str, status: str) -> jsonschema.Draft202012Validator:
    """The schema the document gives ``method path``'s ``status`` JSON answer."""
    doc = document()
    schema = doc["paths"][path][method]["responses"][status]["content"]["application/json"]
    root = {**schema["schema"], "components": doc["components"]}
    return jsonschema.Draft202012Validator(root)


def test_every_own_answer_is_a_model_s_schema_not_an_open_object() -> None:
    """The answers the router makes itself name their model's schema; none is a bare
    ``{"type": "object"}`` as a hand-kept document had them."""
    doc = document()
    for path in ("/router/status", "/health", "/ready", "/v1/models", "/v1/loads"):
        schema = doc["paths"][path]["get"]["responses"]["200"]["content"]["application/json"]
        assert "$ref" in schema["schema"], path
    status = doc["components"]["schemas"]["RouterStatus"]
    assert {"policy", "backends", "online", "draining"} <= set(status["required"])


async def test_what_a_live_router_answers_is_what_the_document_says() -> None:
    async with AsyncExitStack() as stack:
        spec = await stack.enter_async_context(running_emulator("--mode", "spec", *FAST))
        base = await stack.enter_async_context(running_emulator("--mode", "base", *FAST))
        url, _ = await stack.enter_async_context(
            running_router(
                spec=[spec],
                base=[base],
                given_params={"crossover": 8},
                poll_interval=0.1,
                admin_key=ADMIN,
            )
        )
        admin = {"Authorization": f"Bearer {ADMIN}"}
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{url}/v1/chat/completions", json=CHAT) as r:
                assert r.status == 200 and b"[DONE]" in await r.read()  # a sample
            answers: list[tuple[str, str, dict[str, Any]]] = []
            for path in ("/router/status", "/health", "/ready", "/v1/models", "/v1/loads"):
                async with s.get(url + path, headers=admin) as r:
                    assert r.status == 200, path
                    answers.append((path, "200", await r.json()))
            async with s.get(url + "/router/online/samples", headers=admin) as r:
                assert r.status == 200
                samples = await r.json()
                assert samples["samples"], "the stream made a sample"
                answers.append(("/router/online/samples", "200", samples))
            async with s.get(url + "/v1/loads?dp_rank=9", headers=admin) as r:
                answers.append(("/v1/loads", str(r.status), await r.json()))
        for path, status, body in answers:
            _validator(path, "get", status).validate(body)


@pytest.mark.parametrize("rid", [None, "req-7"])
def test_the_error_model_keeps_openai_s_shape(rid: str | None) -> None:
    """``param`` is always there (null when none), the request's id only when there is
    one; the document's ``Error`` takes both."""
    if rid is None:
        body = error_json("no", "invalid_request_error", 400)
    else:
        token = enter(rid)
        try:
            body = error_json("no", "invalid_request_error", 400)
        finally:
            leave(token)
    expected: dict[str, Any] = {"message": "no", "type": "invalid_request_error"}
    expected |= {"param": None, "code": 400} | ({} if rid is None else {"request_id": rid})
    assert body == {"error": expected}
    _validator("/router/status", "get", "401").validate(json.loads(json.dumps(body)))
