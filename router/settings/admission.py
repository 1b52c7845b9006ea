"""Who may send requests, how many at once and how fast."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class AdmissionSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="the keys clients must send as Bearer tokens; none: no key asked (prefer "
        "the environment, SPECROUTE_API_KEYS='[\"k\"]', to the flag)",
        json_schema_extra={"flag": "--api-key", "metavar": "KEY"},
    )
    max_concurrent_requests: int | None = Field(
        None,
        ge=1,
        description="requests the router serves at once, through all its workers; more wait "
        "in the queue; none: no limit",
    )
    queue_size: int = Field(
        100,
        ge=0,
        description="requests that may wait for admission, through all the workers; one more "
        "is refused with 429",
    )
    queue_timeout: float = Field(
        60.0, gt=0, description="seconds a request may wait for admission; then refused with 503"
    )
    queue_at_capacity: bool = Field(
        False,
        description="a request whose pool has no healthy backend running fewer requests than "
        "its reported capacity (max_running_requests) waits in the queue instead",
    )
    rate_limit: float | None = Field(
        None,
        gt=0,
        description="requests a second each API key may send (one bucket for all when no "
        "keys are set); more are refused with 429; none: no limit",
    )
    rate_limit_burst: int | None = Field(
        None, ge=1, description="requests a key may send at once; none: the rate, at least 1"
    )
