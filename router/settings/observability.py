"""What the router says of the requests it serves: request ids, log lines, decisions, traces."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from specroute.router.observability.tracing import available as tracing_available


class ObservabilitySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    request_id_headers: list[str] = Field(
        default_factory=lambda: ["x-request-id"],
        min_length=1,
        description="the headers a client's request id is read from, the first it sent; "
        "none: the router makes one. It goes upstream as x-request-id (and as rid on a "
        "/generate body without one) and comes back in the header it came in",
        json_schema_extra={"flag": "--request-id-header", "metavar": "NAME"},
    )
    access_log: bool = Field(
        True,
        description="one line for each request, at its end, on the specroute.router.access logger",
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="how log lines are written: text, or one JSON object a line"
    )
    recent_decisions: int = Field(
        50, ge=0, description="how many of the last decisions /router/status shows"
    )
    otlp_traces_endpoint: str | None = Field(
        None,
        description="where to export OpenTelemetry traces, an OTLP/HTTP collector's URL "
        "(http://HOST:4318/v1/traces): a span per request, its routing decision as attributes, "
        "W3C traceparent sent upstream; needs pip install 'specroute[otel]'; none: no traces",
        json_schema_extra={"metavar": "URL"},
    )

    @field_validator("otlp_traces_endpoint")
    @classmethod
    def _tracing_installed(cls, endpoint: str | None) -> str | None:
        if endpoint is not None and not tracing_available():
            raise ValueError(
                "traces need OpenTelemetry's SDK and OTLP exporter: pip install 'specroute[otel]'"
            )
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise ValueError("an OTLP/HTTP endpoint starts with http:// or https://")
        return endpoint
