"""OpenTelemetry traces, with the ``otel`` extra and ``otlp_traces_endpoint`` set: a span per
proxied request, the routing decision and how the request ended as its attributes, exported
over OTLP/HTTP from the SDK's own thread. A W3C ``traceparent`` from the client makes the
span its child; the span's own goes upstream, so the server's spans join the same trace.

Nothing of OpenTelemetry is imported until a ``Tracing`` is made: with traces off, the
request path pays nothing for them. A request's span is a field of its record
(``RequestRecord.span``); ``Spans`` writes what the router learns of it as its attributes.
"""

from __future__ import annotations

import asyncio
import importlib.util
from typing import TYPE_CHECKING, Any

from specroute.policies.decision import Decision
from specroute.router.protocol.asked import Asked
from specroute.router.protocol.outcome import Outcome

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

EXTRA = "opentelemetry.sdk"  # what `pip install 'specroute[otel]'` brings


def available() -> bool:
    return importlib.util.find_spec(EXTRA) is not None


class RequestSpan:
    """One proxied request's span; what the router learns of the request, as attributes."""

    def __init__(self, span: Span, propagator: TraceContextTextMapPropagator) -> None:
        self.span, self._propagator = span, propagator

    def decided(self, decision: Decision, policy: str, load: int) -> None:
        attributes: dict[str, Any] = {
            "specroute.pool": decision.pool,
            "specroute.policy": policy,
            "specroute.reason": decision.reason,
            "specroute.load": load,
        }
        if decision.backend is not None:
            attributes["specroute.backend"] = decision.backend
        self.span.set_attributes(attributes)

    def landed(self, outcome: Outcome | None, backend: str) -> None:
        """One attempt at a backend ended (a retried one is followed by another)."""
        self.span.set_attribute("specroute.backend", backend)
        if outcome is not None:
            self.span.set_attribute("specroute.outcome", str(outcome))

    def refused(self, reason: str) -> None:
        self.span.set_attribute("specroute.outcome", reason)

    def upstream_headers(self) -> dict[str, str]:
        from opentelemetry import trace

        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, trace.set_span_in_context(self.span))
        return carrier

    def end(self, status: int | None) -> None:
        from opentelemetry.trace import StatusCode

        if status is not None:
            self.span.set_attribute("http.response.status_code", status)
            if status >= 500:
                self.span.set_status(StatusCode.ERROR)
        else:
            self.span.set_status(StatusCode.ERROR)  # an exception: aiohttp answers 500
        self.span.end()


class Tracing:
    def __init__(self, endpoint: str, service: str = "specroute") -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # a provider of its own, not the process-wide one: two routers in one process
        # (the tests) export apart
        self._provider: TracerProvider = TracerProvider(
            resource=Resource.create({"service.name": service})
        )
        self._provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
        self._tracer: Tracer = self._provider.get_tracer("specroute.router")
        self._propagator = TraceContextTextMapPropagator()

    def start(self, request: Asked) -> RequestSpan:
        from opentelemetry.trace import SpanKind

        parent = self._propagator.extract(request.headers)  # the client's traceparent, if any
        span = self._tracer.start_span(
            f"{request.method} {request.path}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": request.method, "url.path": request.path},
        )
        return RequestSpan(span, self._propagator)

    async def close(self) -> None:
        """The spans not yet exported, sent (the SDK's shutdown blocks: off the loop)."""
        await asyncio.to_thread(self._provider.shutdown)
