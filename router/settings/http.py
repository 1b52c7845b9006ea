"""Where the router listens and what it accepts from a client connection."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class HttpSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = Field(
        "127.0.0.1",
        description="the address the router listens on",
        json_schema_extra={"metavar": "HOST"},
    )
    port: int = Field(8000, ge=0, le=65535, description="the port it listens on")
    front: Literal["own", "aiohttp"] = Field(
        "own",
        description="what serves the proxied paths: the router's own HTTP/1.1 front (llhttp "
        "on a bare protocol, a fraction of aiohttp's CPU a request; every other path, and "
        "every request after one to another path on a connection, is aiohttp's on the same "
        "port), or aiohttp's server for all of them",
    )
    max_body_bytes: int = Field(
        8 * 1024 * 1024, gt=0, description="largest request body accepted (413 past it)"
    )
    body_timeout: float = Field(
        60.0, gt=0, description="longest time a client may take to send a whole request body"
    )
    client_idle_timeout: float = Field(
        75.0,
        gt=0,
        description="a client connection that has not sent a whole request head this long "
        "after it opened or after its last answer is closed: idle keep-alive and slowloris "
        "alike (longer than a load balancer's usual 60 s, so the balancer closes first)",
    )
    max_header_bytes: int = Field(
        8190, ge=1024, description="longest target in a request line, longest header name or value"
    )
    max_headers: int = Field(128, ge=8, description="most headers in one request")
    max_pipelined_requests: int = Field(
        32,
        ge=1,
        description="requests a client may send on one connection ahead of the answer it "
        "waits for: past them the connection is not read until answers catch up",
    )
    max_pipelined_bytes: int = Field(
        1024 * 1024,
        ge=64 * 1024,
        description="bytes of requests a client may send on one connection ahead of the "
        "answer it waits for: past them the connection is not read until answers catch up",
    )
    client_write_timeout: float = Field(
        60.0,
        gt=0,
        description="a client that reads nothing of its answer this long is cut off, and its "
        "request at the backend aborted",
    )
