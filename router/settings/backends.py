"""Which servers the router sends to: given by URL, by a name to resolve, or in a watched file."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from specroute.policies.view import Pool
from specroute.router.backends.backend import Server
from specroute.router.backends.discovery import SCHEMES, is_dns


class BackendSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    spec: list[str] = Field(
        default_factory=list,
        description="speculative backends' base URLs; dns+http://NAME:PORT: every address "
        "NAME resolves to (a headless Kubernetes Service), resolved again as it changes",
        json_schema_extra={"metavar": "URL"},
    )
    base: list[str] = Field(
        default_factory=list,
        description="plain backends, likewise",
        json_schema_extra={"metavar": "URL"},
    )
    backends_file: Path | None = Field(
        None,
        description="more backends, from a file watched for changes, in Prometheus' file_sd "
        'form: [{"targets": ["HOST:PORT"], "labels": {"pool": "spec|base", "group": G}}]',
    )
    groups: list[list[str]] = Field(
        default_factory=list,
        description="GPU groups of the shared topology: each the URLs of the servers that "
        "share GPUs (a speculative and a plain one); servers in no group form one group",
        json_schema_extra={"flag": "--group"},
    )
    watch_interval: float = Field(
        5.0,
        gt=0,
        description="seconds between readings of the DNS names (the backends' and the "
        "online peers'), the backends file and the profile file",
    )
    max_backends: int = Field(64, ge=1, le=4096, description="most backends known at once")

    @field_validator("spec", "base")
    @classmethod
    def _urls(cls, urls: list[str]) -> list[str]:
        for url in urls:
            if not url.startswith(SCHEMES):
                raise ValueError(f"backend URL must start with {', '.join(SCHEMES)}, got {url!r}")
        return [u.rstrip("/") for u in urls]

    @field_validator("groups")
    @classmethod
    def _group_urls(cls, groups: list[list[str]]) -> list[list[str]]:
        return [[u.rstrip("/") for u in group] for group in groups]

    @model_validator(mode="after")
    def _known(self) -> BackendSettings:
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

    def servers(self) -> list[Server]:
        """Each backend given by URL once, with its pool and group: a server given twice in
        a pool is one server. Names to resolve and the backends file come at run time."""
        group = {url: f"group{i}" for i, urls in enumerate(self.groups, 1) for url in urls}
        named: dict[str, Server] = {}
        for pool, urls in self._pools():
            for url in urls:
                if not is_dns(url):
                    server = Server(url, pool, group.get(url, ""))
                    named.setdefault(server.name, server)
        return list(named.values())

    def names(self) -> list[tuple[str, Pool]]:
        """The ``dns+`` URLs to resolve, with their pools."""
        return [(url, pool) for pool, urls in self._pools() for url in urls if is_dns(url)]

    def discovers(self) -> bool:
        """Whether the set of backends may change while the router runs."""
        return self.backends_file is not None or bool(self.names())

    def columns(self) -> int:
        """Backends the workers' board has room for: the servers given, or as many as may
        be known at once when servers are discovered."""
        return self.max_backends if self.discovers() else len(self.servers())

    def _pools(self) -> tuple[tuple[Pool, list[str]], ...]:
        return (("spec", self.spec), ("base", self.base))
