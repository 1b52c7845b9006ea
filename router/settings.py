"""The router's one settings object: flags, ``SPECROUTE_*`` environment and a TOML file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from specroute.policies.registry import entry
from specroute.policies.view import ConcurrencySource


class RouterSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="SPECROUTE_", extra="forbid")

    spec: list[str] = Field(min_length=1, description="speculative backends' base URLs")
    base: list[str] = Field(min_length=1, description="plain backends' base URLs")
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    policy: str = "crossover"
    crossover: float | None = Field(None, ge=0)
    topology: str | None = None
    hysteresis: float | None = Field(None, ge=0)
    profile: Path | None = None
    concurrency_source: ConcurrencySource = ConcurrencySource.ROUTER
    poll_interval: float = Field(0.5, gt=0)
    stale_after: float = Field(2.0, gt=0)
    health_interval: float = Field(2.0, gt=0)
    health_timeout: float = Field(2.0, gt=0)
    connect_timeout: float = Field(5.0, gt=0)
    idle_timeout: float = Field(300.0, gt=0, description="longest silence within a stream")
    request_timeout: float = Field(
        1800.0, gt=0, description="deadline of a whole non-streamed answer, sent at its end"
    )
    max_body_bytes: int = Field(8 * 1024 * 1024, gt=0)
    api_keys: list[SecretStr] = Field(default_factory=list)
    admin_key: SecretStr | None = None
    backend_api_key: SecretStr | None = None
    drain_grace: float = Field(5.0, ge=0, description="after SIGTERM: not ready, still serving")
    drain_timeout: float = Field(30.0, ge=0)
    recent_decisions: int = Field(50, ge=0)
    config: Path | None = Field(None, exclude=True)

    @field_validator("spec", "base")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"backend URL must start with http:// or https://, got {url!r}")
        return [u.rstrip("/") for u in urls]

    def policy_params(self) -> dict[str, Any]:
        """The routing settings the chosen policy takes: one config serves every policy
        (a comparison runs them all), and each policy still refuses what it does not know
        when given it directly."""
        params = {
            "crossover": self.crossover,
            "topology": self.topology,
            "hysteresis": self.hysteresis,
        }
        keys = entry(self.policy).keys()
        return {k: v for k, v in params.items() if v is not None and k in keys}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags over environment over the ``--config`` TOML file."""
        path = getattr(init_settings, "init_kwargs", {}).get("config")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(path)))
        return tuple(sources)
