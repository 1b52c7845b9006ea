"""How the router talks to a backend: its timeouts, the longest answer head, its key."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from specroute.router.upstream.pool import MAX_HEAD


class UpstreamSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    connect_timeout: float = Field(
        5.0, gt=0, description="seconds to open a connection to a backend"
    )
    idle_timeout: float = Field(300.0, gt=0, description="longest silence within a stream")
    request_timeout: float = Field(
        1800.0, gt=0, description="deadline of a whole non-streamed answer, sent at its end"
    )
    max_head_bytes: int = Field(
        MAX_HEAD,
        ge=1024,
        description="longest head of a backend's answer (its status line and headers); a "
        "longer one is a broken answer",
        json_schema_extra={"flat": "max_upstream_head_bytes"},
    )
    api_key: SecretStr | None = Field(
        None,
        description="the key the router sends to the backends",
        json_schema_extra={"flat": "backend_api_key", "metavar": "KEY"},
    )
