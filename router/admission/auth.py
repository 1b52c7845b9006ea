"""Bearer keys: optional client keys for serving, and the admin key that changing the
router's routing, reading the profile of its live fit, or reading its online samples (a
peer replica's pull) needs: without one configured, those endpoints refuse (fail closed).
Flushing the servers' caches (``/flush_cache``), profiling them (``/start_profile``,
``/stop_profile``) or aborting their requests (``/abort_request``) changes the servers,
not routing: as on SGLang, it needs the admin key where one is configured, and otherwise
what serving needs.

Probes and scrapers (``/health``, ``/ready`` and SGLang's name for it ``/health_generate``,
``/metrics``) and the router's own API
description (``/openapi.json``) stay open. Keys are compared in
constant time and never logged or echoed; the client's ``Authorization`` header is never
forwarded to a backend (the router sends its own backend key, if any).
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from urllib.parse import urlsplit, urlunsplit

from aiohttp import web
from pydantic import SecretStr

from specroute.router.protocol.asked import Asked
from specroute.router.protocol.errors import error_response

OPEN_PATHS = frozenset({"/health", "/ready", "/health_generate", "/metrics", "/openapi.json"})
ADMIN_PATHS = frozenset({"/router/profile", "/router/profile/live", "/router/online/samples"})
# what changes the servers but not routing (SGLang's ADMIN_OPTIONAL): the admin key where
# one is configured, else as the serving paths
OPERATOR_PATHS = frozenset({"/flush_cache", "/start_profile", "/stop_profile", "/abort_request"})


def _bearer(request: Asked) -> str | None:
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _matches(token: str, keys: Sequence[SecretStr]) -> bool:
    found = False
    for key in keys:  # no early exit: the time taken does not tell which key was close
        given = token.encode("utf-8", "surrogateescape")  # header bytes as they came
        found |= hmac.compare_digest(given, key.get_secret_value().encode())
    return found


def _index(token: str, keys: Sequence[SecretStr]) -> int | None:
    """Which of ``keys`` ``token`` is, compared with every one as ``_matches`` does."""
    found = None
    given = token.encode("utf-8", "surrogateescape")
    for i, key in enumerate(keys):
        if hmac.compare_digest(given, key.get_secret_value().encode()):
            found = i
    return found


class Keys:
    """Who may do what: ``refusal`` says why a request may not, or nothing if it may."""

    def __init__(self, clients: Sequence[SecretStr], admin: SecretStr | None) -> None:
        self.clients = list(clients)
        self.admins = [admin] if admin is not None else []

    def refusal(self, request: Asked) -> web.Response | None:
        if request.path in OPEN_PATHS:
            return None
        admin_path = request.path in ADMIN_PATHS
        if admin_path and not self.admins:
            return error_response(
                403,
                "This endpoint needs the router's admin key, and none is configured "
                "(SPECROUTE_ADMIN_KEY or --admin-key): refused.",
                "permission_error",
            )
        clients, admins = self.clients, self.admins
        admin_path = admin_path or (request.path in OPERATOR_PATHS and bool(admins))
        needed = admins if admin_path else [*clients, *admins] if clients else []
        if not needed:
            return None
        token = _bearer(request)
        if token is None:
            return error_response(
                401, "Missing API key: send 'Authorization: Bearer <key>'.", "authentication_error"
            )
        if _matches(token, needed):
            return None
        if admin_path and _matches(token, clients):
            return error_response(403, "This endpoint needs the admin key.", "permission_error")
        return error_response(401, "Incorrect API key provided.", "authentication_error")

    def names(self) -> list[str]:
        """What a metric may call each key instead of the key: ``anonymous`` for requests
        with none of them, ``keyN`` for the N-th client key given, ``admin``."""
        clients = [f"key{i}" for i in range(len(self.clients))]
        return ["anonymous", *clients, *(["admin"] if self.admins else [])]

    def holder(self, request: Asked) -> int:
        """The index in ``names`` of the key ``request`` came with."""
        token = _bearer(request)
        index = None if token is None else _index(token, [*self.clients, *self.admins])
        return 0 if index is None else index + 1


def without_credentials(url: str) -> str:
    """A URL as shown, logged or counted: any ``user:password@`` in it left out."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host  # an IPv6 address, bracketed again
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit(parts._replace(netloc=netloc))
