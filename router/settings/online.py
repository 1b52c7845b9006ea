"""Online calibration: the live curves fitted from served requests, how long their samples
count, when the live crossover is sure enough to route by, and exploration."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specroute.online.estimator import ACCEPT_TOLERANCE, KEPT_PER_LEVEL, OnlineMode
from specroute.router.backends.discovery import SCHEMES, is_dns


class OnlineSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    mode: OnlineMode = Field(
        OnlineMode.OBSERVE,
        description="the crossover learned from live traffic: off; observe (estimate, export "
        "and flag drift from the profile); adopt (route by it once sure, else by the profile)",
        json_schema_extra={"flat": "online"},
    )
    interval: float = Field(
        5.0,
        gt=0,
        description="seconds between fits of the live curves, off the request path",
        json_schema_extra={"flat": "online_interval"},
    )
    window_seconds: float = Field(
        3600.0,
        gt=0,
        description="the forgetting window: samples older than this do not count (an hour: "
        "exploration's turns at 2% gather a level's samples over tens of minutes; a drop in "
        "acceptance is followed sooner, by online_accept_tolerance)",
        json_schema_extra={"flat": "online_window_seconds"},
    )
    window_samples: int = Field(
        64,
        ge=4,
        le=1 << 14,
        description="the forgetting window: the last samples of each pool and level of load "
        "that count (a level follows drift as fast as its new samples come)",
        json_schema_extra={"flat": "online_window_samples"},
    )
    min_samples: int = Field(
        16,
        ge=4,
        description="sure enough to adopt: live samples at each level around the crossover",
        json_schema_extra={"flat": "online_min_samples"},
    )
    max_ratio: float = Field(
        2.0,
        gt=1,
        description="sure enough to adopt: the widest interval of the live crossover, high / low",
        json_schema_extra={"flat": "online_max_ratio"},
    )
    accept_tolerance: float = Field(
        ACCEPT_TOLERANCE,
        ge=0,
        description="a speculative sample whose accept length (its server's at its end) is "
        "further than this from the speculative servers' now, relative, is left out of the "
        "fit as taught by another drafter, and counts again if acceptance comes back "
        "(0: none left out; the default is wider than a polling window's noise at low load)",
        json_schema_extra={"flat": "online_accept_tolerance"},
    )
    at_prefill: bool = Field(
        True,
        description="compare the pools at the same prefill: each sample's TPOT read at its "
        "level's mean prefill (the prompt tokens sent to its GPUs while it decoded) along the "
        "slope the fit finds, and a dense margin that turns more than once read as the one "
        "fall most samples put it at; on bursty traffic the plain samples that count decoded "
        "through fewer prompts (off: each sample read as measured; the online guide gives "
        "both, over many draws of the same traffic)",
        json_schema_extra={"flat": "online_at_prefill"},
    )
    explore_share: float = Field(
        0.02,
        ge=0,
        le=1,
        description="exploration: of the requests a crossover decides, the most sent to the "
        "other pool in turns near the crossover, so that the live curves see both pools at "
        "the levels that decide it (0: none; never with online=off; the default, 0.02: one "
        "request in 50)",
        json_schema_extra={"flat": "online_explore_share"},
    )
    explore_span: float = Field(
        4.0,
        gt=1,
        description="exploration: where the level the other pool would come to hold lies "
        "within this factor of the crossover routed by (4: a profile off by 4 either way is "
        "reached at once); never past the crossover times it, an ejected server or one at "
        "its max_running_requests",
        json_schema_extra={"flat": "online_explore_span"},
    )
    peers: list[str] = Field(
        default_factory=list,
        description="the other router replicas in front of the same servers, by base URL "
        "(http://HOST:PORT) or by a name to resolve (dns+http://NAME:PORT: every IPv4 "
        "address NAME has is a replica on PORT, this one among them, resolved again every "
        "watch_interval): before each fit the leader takes their new online samples "
        "(GET /router/online/samples, sent the admin key, which they must share), so that "
        "every replica fits from all of theirs; needs admin_key and online on",
        json_schema_extra={"flat": "online_peers", "urls": True},
    )

    @field_validator("peers")
    @classmethod
    def _peer_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(SCHEMES):
                raise ValueError(f"a peer's URL starts with {', '.join(SCHEMES)}, got {url!r}")
            if is_dns(url) and urlsplit(url).port is None:
                raise ValueError(f"a peer's name to resolve needs a port, got {url!r}")
        return list(dict.fromkeys(u.rstrip("/") for u in urls))  # a peer given twice is one

    @model_validator(mode="after")
    def _peers_learn(self) -> OnlineSettings:
        if self.peers and self.mode is OnlineMode.OFF:
            raise ValueError("online_peers needs online calibration on (observe or adopt)")
        return self

    def kept(self) -> int:
        """The online samples kept at most (those that count are fewer: the window)."""
        return self.window_samples * KEPT_PER_LEVEL

    def explores(self) -> bool:
        """Whether exploration runs: online calibration on, with a share."""
        return self.mode is not OnlineMode.OFF and self.explore_share > 0
