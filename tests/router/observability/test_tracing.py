"""OpenTelemetry traces: the router's spans, exported by the SDK's OTLP/HTTP exporter into a
receiver the test starts, which decodes each export request with opentelemetry-proto; a
backend in the test records the ``traceparent`` it is sent."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp import web
from pydantic import ValidationError

pytest.importorskip(
    "opentelemetry.sdk", reason="the otel extra is not installed: pip install 'specroute[otel]'"
)
trace_service = pytest.importorskip(
    "opentelemetry.proto.collector.trace.v1.trace_service_pb2",
    reason="opentelemetry-proto (a dev dependency) decodes the export requests",
)

from specroute.router.settings import RouterSettings  # noqa: E402
from tests.apps import serving  # noqa: E402
from tests.routers import running_router  # noqa: E402

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
CHAT: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


class Receiver:
    """An OTLP/HTTP traces endpoint: every span it is sent, decoded."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/traces", self._export)

    async def _export(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        export = trace_service.ExportTraceServiceRequest.FromString(await request.read())
        for resource in export.resource_spans:
            for scope in resource.scope_spans:
                self.spans.extend(scope.spans)
        answer = trace_service.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")


class Backend:
    """SGLang-shaped enough for the router: the ``traceparent`` of each request it serves."""

    def __init__(self) -> None:
        self.traceparents: list[str | None] = []
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_get("/health", self._empty)
        self.app.router.add_get("/metrics", self._empty)

    async def _empty(self, request: web.Request) -> web.Response:
        return web.Response(text="")

    async def _chat(self, request: web.Request) -> web.Response:
        await request.read()
        self.traceparents.append(request.headers.get("traceparent"))
        message = {"role": "assistant", "content": "hello"}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        answer = {"id": "x", "object": "chat.completion", "created": 0, "model": "m"}
        return web.json_response({**answer, "choices": [choice]})


@asynccontextmanager
async def deployment() -> AsyncIterator[tuple[Receiver, Backend, dict[str, Any]]]:
    """The receiver, the speculative backend, and the router's settings for them."""
    receiver, spec, base = Receiver(), Backend(), Backend()
    async with (
        serving(receiver.app) as otlp,
        serving(spec.app) as spec_url,
        serving(base.app) as base_url,
    ):
        settings = {"spec": [spec_url], "base": [base_url], "crossover": 4}
        yield receiver, spec, settings | {"otlp_traces_endpoint": f"{otlp}/v1/traces"}


def attributes(span: Any) -> dict[str, Any]:
    found = {}
    for kv in span.attributes:
        value = kv.value
        found[kv.key] = getattr(value, value.WhichOneof("value"))
    return found


async def test_a_span_per_request_with_its_decision_and_the_trace_sent_upstream() -> None:
    async with deployment() as (receiver, spec, settings):
        limited = settings | {"rate_limit": 0.01, "rate_limit_burst": 2}
        async with running_router(**limited) as (url, _):
            client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            parent = f"00-{TRACE_ID}-{CLIENT_SPAN}-01"
            await client.chat.completions.create(**CHAT, extra_headers={"traceparent": parent})
            await client.chat.completions.create(**CHAT)  # a trace of its own
            with pytest.raises(openai.RateLimitError):
                await client.chat.completions.create(**CHAT)
            await client.close()
        # the router's cleanup exported what was left
    assert len(receiver.spans) == 3, receiver.spans
    *served, refused = sorted(receiver.spans, key=lambda s: s.start_time_unix_nano)
    assert attributes(refused) == {
        "http.request.method": "POST",
        "url.path": "/v1/chat/completions",
        "specroute.outcome": "rate_limited",
        "http.response.status_code": 429,
    }
    joined, alone = served
    assert joined.trace_id.hex() == TRACE_ID and joined.parent_span_id.hex() == CLIENT_SPAN
    assert alone.trace_id.hex() != TRACE_ID and not alone.parent_span_id
    for span, sent in zip((joined, alone), spec.traceparents, strict=True):
        assert span.name == "POST /v1/chat/completions"
        assert span.kind == 2  # SPAN_KIND_SERVER
        # the server's span is the router's child
        assert sent is not None
        version, trace_id, parent_id, flags = sent.split("-")
        assert (version, trace_id, parent_id) == ("00", span.trace_id.hex(), span.span_id.hex())
        assert int(flags, 16) & 1  # sampled
        found = attributes(span)
        assert found["specroute.pool"] == "spec" and found["specroute.policy"] == "crossover"
        assert found["specroute.backend"].startswith("spec:127.0.0.1:")
        assert found["specroute.reason"] and found["specroute.load"] == 0
        assert found["specroute.outcome"] == "answered"
        assert found["http.response.status_code"] == 200


def test_without_traces_nothing_of_opentelemetry_is_imported() -> None:
    """A router built and answering without an endpoint, in a fresh interpreter."""
    program = """
import asyncio, sys
import aiohttp
from specroute.router.app import create_app
from specroute.router.settings import RouterSettings
from tests.apps import serving

async def main():
    app = create_app(RouterSettings(spec=["http://127.0.0.1:1"], base=["http://127.0.0.1:2"], crossover=4))
    async with serving(app) as url, aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json={"messages": []}) as r:
            await r.read()
    print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))

asyncio.run(main())
"""
    done = subprocess.run(
        [sys.executable, "-c", program],
        cwd=Path(__file__).parents[3],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout


def test_an_endpoint_that_is_not_a_url_stops_the_start() -> None:
    with pytest.raises(ValidationError, match="starts with http"):
        RouterSettings.model_validate(
            {
                "spec": ["http://127.0.0.1:1"],
                "base": ["http://127.0.0.1:2"],
                "otlp_traces_endpoint": "x:4318",
            }
        )
