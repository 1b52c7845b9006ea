"""Which servers the router routes between, while they come and go.

Three sources, all read again every ``watch_interval``: URLs given as such; names to
resolve, ``dns+http://NAME:PORT`` (every IPv4 address NAME has is a server on PORT: a
headless Kubernetes Service lists its ready pods so); and a file in Prometheus' file_sd
form, whose labels say each target's pool and GPU group. A source that cannot be read
keeps what it last gave, said in the log and in ``specroute_watch_failures_total``: a
resolver's hiccup or a half-written file does not empty a pool. Only at start does a bad
backends file stop the router.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from specroute.policies.view import POOLS, Pool
from specroute.router.backends.backend import Server

_log = logging.getLogger("specroute.router")

SCHEMES = ("http://", "https://", "dns+http://", "dns+https://")
_DNS = "dns+"

Resolve = Callable[[str, int], Awaitable[list[str]]]


def is_dns(url: str) -> bool:
    return url.startswith(_DNS)


async def resolve_ipv4(host: str, port: int) -> list[str]:
    """Every IPv4 address of ``host``, sorted: the system's resolver, off the event loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        host, port, family=socket.AF_INET, type=socket.SOCK_STREAM
    )
    return sorted({str(info[4][0]) for info in infos})


class DiscoveryError(ValueError):
    """A backends file that cannot be used; the message says where and why."""


async def lookup(url: str, resolve: Resolve = resolve_ipv4) -> list[str]:
    """The URLs a ``dns+`` URL stands for now, one per IPv4 address of its name, each on its
    port and in its scheme (the backends' and the peer replicas' alike); raises OSError when
    the name does not resolve, DiscoveryError when the URL has no host or port."""
    parts = urlsplit(url.removeprefix(_DNS))
    host, port = parts.hostname, parts.port
    if host is None or port is None:
        raise DiscoveryError(f"{url!r}: a name to resolve needs a host and a port")
    return [urlunsplit(parts._replace(netloc=f"{a}:{port}")) for a in await resolve(host, port)]


def read_targets(text: str, where: str) -> list[Server]:
    """The servers of a file_sd document: ``[{"targets": ["HOST:PORT" or a URL],
    "labels": {"pool": "spec"|"base", "group": NAME, "scheme": "http"|"https"}}]``."""
    try:
        data: Any = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DiscoveryError(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise DiscoveryError(f"{where} must be a JSON list of target groups")
    servers: list[Server] = []
    for i, entry in enumerate(data):
        at = f"{where}[{i}]"
        targets = entry.get("targets") if isinstance(entry, dict) else None
        labels = entry.get("labels", {}) if isinstance(entry, dict) else None
        if not isinstance(targets, list) or not isinstance(labels, dict):
            raise DiscoveryError(f"{at} needs 'targets' (a list) and 'labels' (an object)")
        pool, group = labels.get("pool"), labels.get("group", "")
        scheme = labels.get("scheme", "http")
        if pool not in POOLS or not isinstance(group, str) or scheme not in ("http", "https"):
            raise DiscoveryError(
                f"{at}.labels: pool must be spec or base, group a string, scheme http or https"
            )
        for target in targets:
            url = target if isinstance(target, str) and "://" in target else f"{scheme}://{target}"
            if not isinstance(target, str) or urlsplit(url).port is None:
                raise DiscoveryError(f"{at}: target {target!r} must be HOST:PORT or a URL")
            servers.append(Server(url.rstrip("/"), pool, group))
    return servers


class Discovery:
    """The servers to route between now, from every source."""

    def __init__(
        self,
        static: list[Server],
        names: list[tuple[str, Pool]],  # (dns+ URL, its pool)
        file: Path | None,
        failed: Callable[[str], None] = lambda source: None,
        resolve: Resolve = resolve_ipv4,
    ) -> None:
        self.static, self.names, self.file = static, names, file
        self._failed, self._resolve = failed, resolve
        self._resolved: dict[str, list[Server]] = {}  # by name URL: its last answer
        self._from_file: list[Server] = []

    async def servers(self, at_start: bool = False) -> list[Server]:
        """Each server once (by pool and address), static ones first."""
        answers = await asyncio.gather(*(self._lookup(url, pool) for url, pool in self.names))
        for (url, _), answer in zip(self.names, answers, strict=True):
            if answer is not None:
                self._resolved[url] = answer
        self._read_file(at_start)
        named: dict[str, Server] = {}
        for server in (
            *self.static,
            *(s for a in self._resolved.values() for s in a),
            *self._from_file,
        ):
            named.setdefault(server.name, server)
        return list(named.values())

    async def _lookup(self, url: str, pool: Pool) -> list[Server] | None:
        try:
            found = await lookup(url, self._resolve)
        except OSError as exc:  # socket.gaierror: no such name, or no answer
            self._failed("dns")
            host = urlsplit(url.removeprefix(_DNS)).hostname
            _log.warning("Resolving %s failed (%s); its servers stay as they were.", host, exc)
            return None
        return [Server(u, pool) for u in found]

    def _read_file(self, at_start: bool) -> None:
        if self.file is None:
            return
        try:
            self._from_file = read_targets(self.file.read_text(), str(self.file))
        except (OSError, DiscoveryError) as exc:
            if at_start:
                raise DiscoveryError(f"cannot use the backends file: {exc}") from None
            self._failed("backends_file")
            _log.warning("The backends file was not read (%s); its servers stay as they were.", exc)
