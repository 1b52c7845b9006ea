"""The router's one settings object, in parts (``settings.health``, ``settings.online``, ...),
read from flags, ``SPECROUTE_*`` variables and a TOML file by each setting's flat spelling
(``--health-interval``, ``SPECROUTE_HEALTH_INTERVAL``, ``health_interval = 2``) or, in the
file, by its part's table (``[health]``, ``interval = 2``)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from pydantic import (
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    create_model,
    model_validator,
)
from pydantic.functional_validators import ModelWrapValidatorHandler
from pydantic_core import InitErrorDetails
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from specroute.online.estimator import OnlineMode
from specroute.policies.decision import PolicyError
from specroute.policies.registry import FLAT_KEYS, checked, entry
from specroute.router.settings.admission import AdmissionSettings
from specroute.router.settings.backends import BackendSettings
from specroute.router.settings.health import HealthSettings
from specroute.router.settings.http import HttpSettings
from specroute.router.settings.layers import Layers
from specroute.router.settings.observability import ObservabilitySettings
from specroute.router.settings.online import OnlineSettings
from specroute.router.settings.routing import RoutingSettings
from specroute.router.settings.spelling import PARAMS, flat_name, nested, spellings
from specroute.router.settings.upstream import UpstreamSettings

_PREFIX = "SPECROUTE_"


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=_PREFIX, extra="forbid")

    backends: BackendSettings
    routing: RoutingSettings = RoutingSettings.model_validate({})
    health: HealthSettings = HealthSettings.model_validate({})
    upstream: UpstreamSettings = UpstreamSettings.model_validate({})
    http: HttpSettings = HttpSettings.model_validate({})
    admission: AdmissionSettings = AdmissionSettings.model_validate({})
    observability: ObservabilitySettings = ObservabilitySettings.model_validate({})
    online: OnlineSettings = OnlineSettings.model_validate({})
    workers: int = Field(
        1,
        ge=1,
        le=256,
        description="router processes on one port (SO_REUSEPORT) that share one view of load",
        json_schema_extra={"metavar": "N"},
    )
    admin_key: SecretStr | None = Field(
        None,
        description="the key of the endpoints that change routing (POST /router/profile), "
        "give the live fit as a profile (GET /router/profile/live) or this router's online "
        "samples to its peer replicas (GET /router/online/samples); none: they refuse",
        json_schema_extra={"metavar": "KEY"},
    )
    drain_grace: float = Field(5.0, ge=0, description="after SIGTERM: not ready, still serving")
    drain_timeout: float = Field(
        30.0, ge=0, description="after the grace: the longest requests in flight get to finish"
    )
    config: Path | None = Field(None, exclude=True, description="a TOML file of settings")
    _params: dict[str, Any] = PrivateAttr(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        """Each setting by its flat spelling (``health_interval=2``) or by its part
        (``health={"interval": 2}``), over the environment over the ``config`` file."""
        super().__init__(**values)

    @model_validator(mode="wrap")
    @classmethod
    def _by_flat_spelling(
        cls, data: Any, handler: ModelWrapValidatorHandler[RouterSettings]
    ) -> RouterSettings:
        """Flat keys into their parts (as a file or a caller of ``model_validate`` may give
        them), and a refusal named by the flat spelling a flag and a variable take."""
        try:
            return handler(nested(data) if isinstance(data, dict) else data)
        except ValidationError as exc:
            errors = [
                InitErrorDetails(
                    type=e["type"], loc=flat_name(e["loc"]), input=e["input"], ctx=e.get("ctx", {})
                )
                for e in exc.errors()
            ]
            raise ValidationError.from_exception_data(cls.__name__, errors) from None

    @model_validator(mode="after")
    def _peers_keyed(self) -> RouterSettings:
        """Fails closed: a peer's samples are read with the admin key, and a router with
        none serves none."""
        if self.online.peers and self.admin_key is None:
            raise ValueError(
                "online_peers needs the router's admin key (SPECROUTE_ADMIN_KEY or "
                "--admin-key), the same on every replica: peers ask each other with it"
            )
        return self

    @model_validator(mode="after")
    def _one_port(self) -> RouterSettings:
        if self.workers > 1 and self.http.port == 0:
            raise ValueError("workers share one port: give it (port 0 would give each its own)")
        return self

    @model_validator(mode="after")
    def _resolve_params(self) -> RouterSettings:
        """The policy's parameters, checked against its dataclass: from ``given_params``,
        and from the deprecated flat settings the policy takes (one config serves every
        policy, as a comparison runs them all, so it ignores the others); a key given both
        ways with different values is refused."""
        policy = self.routing.policy
        given = checked(policy, self.routing.given_params)
        flat = {k: getattr(self.routing, k) for k in self.deprecated()}
        for key, value in checked(policy, flat).items():
            if given.setdefault(key, value) != value:
                raise PolicyError(
                    f"policy {policy!r}: {key} is given twice with different values, "
                    f"{value!r} as the deprecated setting {key} and {given[key]!r} as a policy "
                    f"parameter; give it once, as a policy parameter"
                )
        self._params = checked(policy, given)
        adopting = self.online.mode is OnlineMode.ADOPT
        if policy == "crossover" and self.routing.profile is None and adopting:
            # no profile: speculate nowhere until the live crossover is sure, which
            # exploration's turns find from 0 up
            self._params.setdefault("crossover", 0.0)
        return self

    def cautions(self) -> list[str]:
        """What the settings allow but a user most likely did not mean, in a sentence each,
        for the start to say once."""
        return self.health.cautions()

    def secrets(self) -> list[str]:
        """Every key the router holds, as what an answer must never carry."""
        held = [*self.admission.api_keys, self.admin_key, self.upstream.api_key]
        return [k.get_secret_value() for k in held if k is not None and k.get_secret_value()]

    def policy_params(self) -> dict[str, Any]:
        """The parameters given to the chosen policy, typed; those not given are its
        defaults."""
        return dict(self._params)

    def deprecated(self) -> list[str]:
        """The deprecated flat settings given, that the chosen policy takes."""
        keys = entry(self.routing.policy).keys()
        return [k for k in FLAT_KEYS if getattr(self.routing, k) is not None and k in keys]

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags over environment over the ``--config`` TOML file, as layers (``Layers``);
        the environment read by each setting's flat spelling."""
        path = getattr(init_settings, "init_kwargs", {}).get("config")
        sources: list[PydanticBaseSettingsSource] = [init_settings, EnvSettingsSource(_FLAT)]
        if path is not None:
            try:
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(path)))
            except tomllib.TOMLDecodeError as exc:
                raise ValueError(f"{path}: {exc}") from None
        return (Layers(settings_cls, sources),)


class _Flat(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=_PREFIX, extra="ignore")


def _flat_model() -> type[BaseSettings]:
    """The settings by their flat spellings, types only: what the environment is read by
    (each ``SPECROUTE_`` and its spelling; a list or a table as JSON)."""
    fields: dict[str, Any] = {}
    for spelling in spellings(RouterSettings).values():
        alias = PARAMS if spelling.flat == "given_params" else None
        fields[spelling.flat] = (spelling.field.annotation, Field(None, validation_alias=alias))
    return create_model("FlatSettings", __base__=_Flat, **fields)


_FLAT = _flat_model()
