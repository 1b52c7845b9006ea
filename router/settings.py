"""The router's one settings object: flags, ``SPECROUTE_*`` environment and a TOML file."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from specroute.policies.decision import PolicyError
from specroute.policies.placement import Placement, PlacementName, placement
from specroute.policies.registry import FLAT_KEYS, checked, entry
from specroute.policies.view import ConcurrencySource, Pool
from specroute.router.backends.backend import Server
from specroute.router.backends.discovery import SCHEMES, is_dns
from specroute.router.backends.health import Ejection
from specroute.router.layers import PARAMS, Layers
from specroute.router.observability.tracing import available as tracing_available
from specroute.router.online.estimator import (
    ACCEPT_TOLERANCE,
    KEPT_PER_LEVEL,
    Online,
    OnlineMode,
    Sureness,
)
from specroute.router.online.exploration import Exploration
from specroute.router.upstream.pool import MAX_HEAD, Limits

_EJECTION = Ejection()  # the breaker's defaults are its own
_DEPRECATED = "deprecated: a policy parameter, given as --policy-param KEY=VALUE instead"


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPECROUTE_", extra="forbid", populate_by_name=True
    )

    spec: list[str] = Field(
        default_factory=list,
        description="speculative backends' base URLs; dns+http://NAME:PORT: every address "
        "NAME resolves to (a headless Kubernetes Service), resolved again as it changes",
    )
    base: list[str] = Field(default_factory=list, description="plain backends, likewise")
    backends_file: Path | None = Field(
        None,
        description="more backends, from a file watched for changes, in Prometheus' file_sd "
        'form: [{"targets": ["HOST:PORT"], "labels": {"pool": "spec|base", "group": G}}]',
    )
    groups: list[list[str]] = Field(
        default_factory=list,
        description="GPU groups of the shared topology: each the URLs of the servers that "
        "share GPUs (a speculative and a plain one); servers in no group form one group",
    )
    watch_interval: float = Field(
        5.0,
        gt=0,
        description="seconds between readings of the DNS names (the backends' and the "
        "online peers'), the backends file and the profile file",
    )
    max_backends: int = Field(64, ge=1, le=4096, description="most backends known at once")
    host: str = Field("127.0.0.1", description="the address the router listens on")
    port: int = Field(8000, ge=0, le=65535, description="the port it listens on")
    policy: str = Field("crossover", description="the routing policy, by name")
    given_params: dict[str, Any] = Field(
        default_factory=dict,
        validation_alias=PARAMS,
        description="the policy's parameters: --policy-param KEY=VALUE, "
        "SPECROUTE_POLICY_PARAMS='{\"crossover\": 40}' (JSON), or [policy.params] in the file; "
        "each checked against the policy's own",
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
    poll_interval: float = Field(
        0.5, gt=0, description="seconds between readings of each backend's load and metrics"
    )
    stale_after: float = Field(
        2.0, gt=0, description="seconds after which a backend's last reading is not believed"
    )
    health_interval: float = Field(2.0, gt=0, description="seconds between health checks")
    health_timeout: float = Field(
        2.0, gt=0, description="seconds a health check may take before it counts as failed"
    )
    eject_after_failures: int = Field(
        _EJECTION.after_failures,
        ge=1,
        description="a backend's failures in a row (requests or health checks) that eject it",
    )
    eject_seconds: float = Field(
        _EJECTION.seconds,
        gt=0,
        description="an ejection's first cool-down; each ejection in a row adds as much",
    )
    eject_max_seconds: float = Field(
        _EJECTION.max_seconds, gt=0, description="the longest cool-down of an ejection"
    )
    readmit_after_successes: int = Field(
        _EJECTION.readmit_after_successes,
        ge=1,
        description="after the cool-down, successful trials in a row that readmit a backend",
    )
    connect_timeout: float = Field(
        5.0, gt=0, description="seconds to open a connection to a backend"
    )
    idle_timeout: float = Field(300.0, gt=0, description="longest silence within a stream")
    request_timeout: float = Field(
        1800.0, gt=0, description="deadline of a whole non-streamed answer, sent at its end"
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
    max_upstream_head_bytes: int = Field(
        MAX_HEAD,
        ge=1024,
        description="longest head of a backend's answer (its status line and headers); a "
        "longer one is a broken answer",
    )
    front: Literal["own", "aiohttp"] = Field(
        "own",
        description="what serves the proxied paths: the router's own HTTP/1.1 front (llhttp "
        "on a bare protocol, a fraction of aiohttp's CPU a request; every other path, and "
        "every request after one to another path on a connection, is aiohttp's on the same "
        "port), or aiohttp's server for all of them",
    )
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="the keys clients must send as Bearer tokens; none: no key asked",
    )
    admin_key: SecretStr | None = Field(
        None,
        description="the key of the endpoints that change routing (POST /router/profile), "
        "give the live fit as a profile (GET /router/profile/live) or this router's online "
        "samples to its peer replicas (GET /router/online/samples); none: they refuse",
    )
    backend_api_key: SecretStr | None = Field(
        None, description="the key the router sends to the backends"
    )
    request_id_headers: list[str] = Field(
        default_factory=lambda: ["x-request-id"],
        min_length=1,
        description="the headers a client's request id is read from, the first it sent; "
        "none: the router makes one. It goes upstream as x-request-id (and as rid on a "
        "/generate body without one) and comes back in the header it came in",
    )
    access_log: bool = Field(
        True,
        description="one line for each request, at its end, on the specroute.router.access logger",
    )
    log_format: Literal["text", "json"] = Field(
        "text", description="how log lines are written: text, or one JSON object a line"
    )
    drain_grace: float = Field(5.0, ge=0, description="after SIGTERM: not ready, still serving")
    drain_timeout: float = Field(
        30.0, ge=0, description="after the grace: the longest requests in flight get to finish"
    )
    recent_decisions: int = Field(
        50, ge=0, description="how many of the last decisions /router/status shows"
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
    otlp_traces_endpoint: str | None = Field(
        None,
        description="where to export OpenTelemetry traces, an OTLP/HTTP collector's URL "
        "(http://HOST:4318/v1/traces): a span per request, its routing decision as attributes, "
        "W3C traceparent sent upstream; needs pip install 'specroute[otel]'; none: no traces",
    )
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="router processes on one port (SO_REUSEPORT) that share one view of load",
    )
    # online calibration: the live curves, from served requests
    online: OnlineMode = Field(
        OnlineMode.OBSERVE,
        description="the crossover learned from live traffic: off; observe (estimate, export "
        "and flag drift from the profile); adopt (route by it once sure, else by the profile)",
    )
    online_interval: float = Field(
        5.0, gt=0, description="seconds between fits of the live curves, off the request path"
    )
    online_window_seconds: float = Field(
        3600.0,
        gt=0,
        description="the forgetting window: samples older than this do not count (an hour: "
        "exploration's turns at 2% gather a level's samples over tens of minutes; a drop in "
        "acceptance is followed sooner, by online_accept_tolerance)",
    )
    online_window_samples: int = Field(
        64,
        ge=4,
        le=1 << 14,
        description="the forgetting window: the last samples of each pool and level of load "
        "that count (a level follows drift as fast as its new samples come)",
    )
    online_min_samples: int = Field(
        16,
        ge=4,
        description="sure enough to adopt: live samples at each level around the crossover",
    )
    online_max_ratio: float = Field(
        2.0,
        gt=1,
        description="sure enough to adopt: the widest interval of the live crossover, high / low",
    )
    online_accept_tolerance: float = Field(
        ACCEPT_TOLERANCE,
        ge=0,
        description="a speculative sample whose accept length (its server's at its end) is "
        "further than this from the speculative servers' now, relative, is left out of the "
        "fit as taught by another drafter, and counts again if acceptance comes back "
        "(0: none left out; the default is wider than a polling window's noise at low load)",
    )
    online_explore_share: float = Field(
        0.02,
        ge=0,
        le=1,
        description="exploration: of the requests a crossover decides, the most sent to the "
        "other pool in turns near the crossover, so that the live curves see both pools at "
        "the levels that decide it (0: none; never with online=off; the default, 0.02: one "
        "request in 50)",
    )
    online_explore_span: float = Field(
        4.0,
        gt=1,
        description="exploration: where the level the other pool would come to hold lies "
        "within this factor of the crossover routed by (4: a profile off by 4 either way is "
        "reached at once); never past the crossover times it, an ejected server or one at "
        "its max_running_requests",
    )
    online_peers: list[str] = Field(
        default_factory=list,
        description="the other router replicas in front of the same servers, by base URL "
        "(http://HOST:PORT) or by a name to resolve (dns+http://NAME:PORT: every IPv4 "
        "address NAME has is a replica on PORT, this one among them, resolved again every "
        "watch_interval): before each fit the leader takes their new online samples "
        "(GET /router/online/samples, sent the admin key, which they must share), so that "
        "every replica fits from all of theirs; needs admin_key and online on",
    )
    config: Path | None = Field(None, exclude=True, description="a TOML file of settings")
    _params: dict[str, Any] = PrivateAttr(default_factory=dict)

    @field_validator("spec", "base")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(SCHEMES):
                raise ValueError(f"backend URL must start with {', '.join(SCHEMES)}, got {url!r}")
        return [u.rstrip("/") for u in urls]

    @field_validator("online_peers")
    @classmethod
    def _peer_urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(SCHEMES):
                raise ValueError(f"a peer's URL starts with {', '.join(SCHEMES)}, got {url!r}")
            if is_dns(url) and urlsplit(url).port is None:
                raise ValueError(f"a peer's name to resolve needs a port, got {url!r}")
        return list(dict.fromkeys(u.rstrip("/") for u in urls))  # a peer given twice is one

    @model_validator(mode="after")
    def _peers_keyed(self) -> RouterSettings:
        """Fails closed: a peer's samples are read with the admin key, and a router with
        none serves none."""
        if self.online_peers and self.admin_key is None:
            raise ValueError(
                "online_peers needs the router's admin key (SPECROUTE_ADMIN_KEY or "
                "--admin-key), the same on every replica: peers ask each other with it"
            )
        if self.online_peers and self.online is OnlineMode.OFF:
            raise ValueError("online_peers needs online calibration on (observe or adopt)")
        return self

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

    @field_validator("groups")
    @classmethod
    def _group_urls(cls, groups: list[list[str]]) -> list[list[str]]:
        return [[u.rstrip("/") for u in group] for group in groups]

    @model_validator(mode="after")
    def _backends(self) -> RouterSettings:
        if self.backends_file is None and not (self.spec and self.base):
            raise ValueError("give both pools' backends (--spec and --base) or a backends file")
        static = {u for u in (*self.spec, *self.base) if not is_dns(u)}
        seen: set[str] = set()
        for group in self.groups:
            for url in group:
                if url not in static:
                    raise ValueError(f"group member {url!r} is not one of --spec or --base")
                if url in seen:
                    raise ValueError(f"{url!r} is in two groups")
                seen.add(url)
        if len(self.servers()) > self.max_backends:
            raise ValueError(f"more backends than max_backends ({self.max_backends})")
        return self

    @model_validator(mode="after")
    def _one_port(self) -> RouterSettings:
        if self.workers > 1 and self.port == 0:
            raise ValueError("workers share one port: give it (port 0 would give each its own)")
        return self

    def cautions(self) -> list[str]:
        """What the settings allow but a user most likely did not mean, in a sentence each,
        for the start to say once."""
        said: list[str] = []
        if self.stale_after < self.poll_interval:
            said.append(
                f"stale_after ({self.stale_after:g} s) is shorter than poll_interval "
                f"({self.poll_interval:g} s): a backend's reading goes stale before the next "
                "one comes, so /router/status and the policies see none most of the time; "
                f"set stale_after to at least {self.poll_interval:g} (a few polls, "
                f"{3 * self.poll_interval:g}, is usual) or poll more often"
            )
        return said

    def sureness(self) -> Sureness:
        return Sureness(self.online_min_samples, self.online_max_ratio)

    def online_kept(self) -> int:
        """The online samples kept at most (those that count are fewer: the window)."""
        return self.online_window_samples * KEPT_PER_LEVEL

    def exploration(self, online: Online) -> Exploration | None:
        """Exploration as the settings give it; None when off (online=off, or no share)."""
        if self.online is OnlineMode.OFF or self.online_explore_share == 0:
            return None
        return Exploration(online, self.online_explore_share, self.online_explore_span)

    @model_validator(mode="after")
    def _cool_downs(self) -> RouterSettings:
        if self.eject_max_seconds < self.eject_seconds:
            raise ValueError(
                f"eject_max_seconds ({self.eject_max_seconds:g}) must be at least "
                f"eject_seconds ({self.eject_seconds:g})"
            )
        return self

    @model_validator(mode="after")
    def _resolve_params(self) -> RouterSettings:
        """The policy's parameters, checked against its dataclass: from ``given_params``,
        and from the deprecated flat settings the policy takes (one config serves every
        policy, as a comparison runs them all, so it ignores the others); a key given both
        ways with different values is refused."""
        given = checked(self.policy, self.given_params)
        flat = {k: getattr(self, k) for k in self.deprecated()}
        for key, value in checked(self.policy, flat).items():
            if given.setdefault(key, value) != value:
                raise PolicyError(
                    f"policy {self.policy!r}: {key} is given twice with different values, "
                    f"{value!r} as the deprecated setting {key} and {given[key]!r} as a policy "
                    f"parameter; give it once, as a policy parameter"
                )
        self._params = checked(self.policy, given)
        if self.policy == "crossover" and self.profile is None and self.online is OnlineMode.ADOPT:
            # no profile: speculate nowhere until the live crossover is sure, which
            # exploration's turns find from 0 up
            self._params.setdefault("crossover", 0.0)
        return self

    def servers(self) -> list[Server]:
        """Each backend given by URL once, with its pool and group: a server given twice in
        a pool is one server. Names to resolve and the backends file come at run time."""
        group = {url: f"group{i}" for i, urls in enumerate(self.groups, 1) for url in urls}
        named: dict[str, Server] = {}
        pools: tuple[tuple[Pool, list[str]], ...] = (("spec", self.spec), ("base", self.base))
        for pool, urls in pools:
            for url in urls:
                if not is_dns(url):
                    server = Server(url, pool, group.get(url, ""))
                    named.setdefault(server.name, server)
        return list(named.values())

    def names(self) -> list[tuple[str, Pool]]:
        """The ``dns+`` URLs to resolve, with their pools."""
        pools: tuple[tuple[Pool, list[str]], ...] = (("spec", self.spec), ("base", self.base))
        return [(url, pool) for pool, urls in pools for url in urls if is_dns(url)]

    def discovers(self) -> bool:
        """Whether the set of backends may change while the router runs."""
        return self.backends_file is not None or bool(self.names())

    def secrets(self) -> list[str]:
        """Every key the router holds, as what an answer must never carry."""
        held = [*self.api_keys, self.admin_key, self.backend_api_key]
        return [k.get_secret_value() for k in held if k is not None and k.get_secret_value()]

    def columns(self) -> int:
        """Backends the workers' board has room for: the servers given, or as many as may
        be known at once when servers are discovered."""
        return self.max_backends if self.discovers() else len(self.servers())

    def upstream_timeouts(self) -> tuple[Limits, Limits]:
        """For a stream and for a whole answer. A stream may run for hours as long as it
        keeps talking; a non-streamed answer comes whole at its end, so it gets a deadline
        instead of an idle limit."""
        stream = Limits(connect=self.connect_timeout, silence=self.idle_timeout, total=None)
        whole = Limits(connect=self.connect_timeout, silence=None, total=self.request_timeout)
        return stream, whole

    def ejection(self) -> Ejection:
        return Ejection(
            after_failures=self.eject_after_failures,
            seconds=self.eject_seconds,
            max_seconds=self.eject_max_seconds,
            readmit_after_successes=self.readmit_after_successes,
        )

    def placer(self) -> Placement:
        """The placement within a pool, as the settings give it."""
        return placement(
            self.placement,
            prefix_bytes=self.affinity_prefix_bytes,
            balance_abs=self.affinity_balance_abs,
            balance_rel=self.affinity_balance_rel,
        )

    def policy_params(self) -> dict[str, Any]:
        """The parameters given to the chosen policy, typed; those not given are its
        defaults."""
        return dict(self._params)

    def deprecated(self) -> list[str]:
        """The deprecated flat settings given, that the chosen policy takes."""
        keys = entry(self.policy).keys()
        return [k for k in FLAT_KEYS if getattr(self, k) is not None and k in keys]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags over environment over the ``--config`` TOML file, as layers (``Layers``)."""
        path = getattr(init_settings, "init_kwargs", {}).get("config")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path is not None:
            try:
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(path)))
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: {exc}") from None
        return (Layers(settings_cls, sources),)
