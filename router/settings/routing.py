"""How a request's server is chosen: the policy and its parameters, the profile it routes
by, the placement within the pool chosen and what counts as a server's load."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from specroute.policies.placement import PlacementName
from specroute.policies.view import ConcurrencySource

_DEPRECATED = "deprecated: a policy parameter, given as --policy-param KEY=VALUE instead"


class RoutingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: str = Field(
        "crossover",
        description="the routing policy, by name (each policy's parameters are listed below)",
        json_schema_extra={"metavar": "NAME"},
    )
    given_params: dict[str, Any] = Field(
        default_factory=dict,
        description="the policy's parameters: --policy-param KEY=VALUE, "
        "SPECROUTE_POLICY_PARAMS='{\"crossover\": 40}' (JSON), or [policy.params] in the file; "
        "each checked against the policy's own",
        json_schema_extra={"flag": "--policy-param", "metavar": "KEY=VALUE"},
    )
    # deprecated: each a policy parameter given as a setting of its own (FLAT_KEYS)
    crossover: float | None = Field(None, ge=0, description=_DEPRECATED)
    topology: str | None = Field(None, description=_DEPRECATED)
    hysteresis: float | None = Field(None, ge=0, description=_DEPRECATED)
    accept_max_age: float | None = Field(None, gt=0, description=_DEPRECATED)
    probe_share: float | None = Field(None, ge=0, le=1, description=_DEPRECATED)
    context: Literal["auto", "off"] | None = Field(None, description=_DEPRECATED)
    profile: Path | None = Field(
        None, description="the calibrated profile to route by, watched for changes"
    )
    placement: PlacementName = Field(
        "least-load",
        description="where in the pool the policy chose a request runs: its least-loaded "
        "server (least-load), or the server that hashing the prompt's first bytes gives, "
        "whose prefix cache likely holds them, unless it is busier than the least-loaded "
        "one by both balance thresholds (prefix-affinity)",
    )
    affinity_prefix_bytes: int = Field(
        1024,
        ge=1,
        le=1 << 20,
        description="prefix-affinity: bytes of the prompt hashed (a chat: its messages in "
        "order, so the system prompt and the first turns)",
    )
    affinity_balance_abs: int = Field(
        16,
        ge=0,
        description="prefix-affinity: requests by which the hashed server's load may exceed "
        "the least-loaded one's before the request goes to the least-loaded one instead",
    )
    affinity_balance_rel: float = Field(
        1.5,
        ge=1,
        description="prefix-affinity: and the ratio of their loads it may reach; past both, "
        "least load wins",
    )
    concurrency_source: ConcurrencySource = Field(
        ConcurrencySource.ROUTER,
        description="what counts as a server's load: the router's own requests in flight "
        "(router), the backend's running and queued (backend), the larger of the two (max), "
        "or, for several router replicas, the backend's report brought up to date with this "
        "router's own requests since (replicas)",
    )
