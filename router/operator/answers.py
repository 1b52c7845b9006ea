"""The router's own answers as typed models: the handlers build each answer through its
model (so an answer that is not of its shape fails where it is made), and the OpenAPI
document's schemas are generated from the same models (``openapi.py``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

Pool = Literal["spec", "base"]


class Alive(BaseModel):
    status: Literal["ok"] = "ok"


class Ready(BaseModel):
    status: Literal["ready"] = "ready"


class ModelList(BaseModel):
    """The healthy backends' models, each card as its server gave it, once per id."""

    object: Literal["list"] = "list"
    data: list[dict[str, Any]]


class Speculative(BaseModel):
    accept_length: float


class LoadEntry(BaseModel):
    """One backend in the place of one of SGLang's data-parallel ranks."""

    dp_rank: int = Field(description="The backend's place in the router.")
    worker: str = Field(description="The backend's URL, without credentials.")
    pool: Pool
    healthy: bool
    timestamp: float = Field(description="Unix seconds.")
    num_running_reqs: int
    num_waiting_reqs: int = Field(description="As the backend reported them queued.")
    num_used_tokens: int = Field(
        description="The KV cache's tokens in use, as the backend last reported them; else "
        "the router's estimate of its requests' context there."
    )
    max_running_requests: int | None = None
    max_total_num_tokens: int | None = Field(
        None, description="The KV cache's size in tokens, where the backend reports it."
    )
    token_usage: float | None = Field(None, description="The first over the second.")
    speculative: Speculative | None = None


class LoadsAggregate(BaseModel):
    total_running_reqs: int
    total_waiting_reqs: int = Field(description="The backends' and the router's queue's.")
    total_reqs: int
    router_waiting_reqs: int = Field(description="Waiting in the router's admission queue.")


class LoadsAnswer(BaseModel):
    """SGLang's ``/v1/loads``, the router's backends in place of its ranks."""

    timestamp: str = Field(description="ISO 8601, UTC.")
    version: str = Field(description="specroute- and its version: a router knows a router.")
    dp_rank_count: int
    loads: list[LoadEntry]
    aggregate: LoadsAggregate


class PolicyShown(BaseModel):
    name: str
    parameters: dict[str, Any]


class WorkerShown(BaseModel):
    index: int
    of: int


class LiveConcurrency(BaseModel):
    total: int
    spec: int
    base: int


class ProfileShown(BaseModel):
    source: str | None = Field(description="The file it was read from; null: posted.")
    created: str | None
    age_seconds: float | None
    loaded_seconds_ago: float
    crossover: Any = Field(description="The profile's crossover as it gives it.")
    contexts: list[float] = Field(description="The KV tokens a request it was measured at.")
    note: str | None


class BreakerShown(BaseModel):
    state: str
    failures_in_a_row: int
    ejections: int
    half_open_in: float | None


class BackendShown(BaseModel):
    name: str
    url: str
    pool: Pool
    group: str
    healthy: bool
    breaker: BreakerShown
    inflight: int
    kv_tokens_inflight: int
    running: int | None
    queued: int | None
    accept_length: float | None
    accept_length_age_seconds: float | None
    spec_depth: float | None = Field(
        description="The draft depth it runs at now, as its last reading said (SGLang's "
        "spec_num_steps; an adaptive server's moves with its batch); null: not reported."
    )
    adaptive: bool | None = Field(
        description="Whether it adapts its own depth (SGLang's speculative_adaptive, from its "
        "/server_info, read once); null: not known (a plain server, or not yet read)."
    )


class RouterStatus(BaseModel):
    """``GET /router/status``: what the router routes by and sees now."""

    policy: PolicyShown
    worker: WorkerShown
    front: Literal["own", "aiohttp"] = Field(description="What serves the proxied paths.")
    concurrency_source: str
    live_concurrency: LiveConcurrency
    profile: ProfileShown | None
    backends: list[BackendShown]
    online: dict[str, Any] = Field(
        description="Online calibration: its mode, samples, fits, drift and exploration."
    )
    recent_decisions: list[dict[str, Any]]
    tasks: int = Field(description="The event loop's tasks: a leak shows here first.")
    draining: bool


class ProfilePosted(BaseModel):
    """``POST /router/profile``'s answer: the policy and profile now in force."""

    policy: PolicyShown
    profile: dict[str, Any] = Field(description="Its created time and crossover.")
