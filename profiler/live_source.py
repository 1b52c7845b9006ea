"""Where ``specroute profile --from-live`` gets its profile: the router's
``GET /router/profile/live``, over HTTP as a user's tool would, with the admin key.

The key comes from a file or the environment, never the command line (where ``ps`` and
shell histories show it), and goes nowhere but the ``Authorization`` header: no message
here quotes it. The router's refusals are shown as their message."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp

LIVE_PATH = "/router/profile/live"
KEY_VARIABLE = "SPECROUTE_ADMIN_KEY"
SECONDS = 60.0  # for the whole answer: the router builds it from fits it already has


def admin_key(path: str | None, environ: Mapping[str, str]) -> str:
    """The router's admin key: from ``path``, else from ``SPECROUTE_ADMIN_KEY``; one word,
    its surrounding whitespace (a file's last newline) left out."""
    if path is not None:
        try:
            key = Path(path).read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            said = exc.strerror if isinstance(exc, OSError) else "not text"
            raise ValueError(f"cannot read the admin key file {path!r}: {said}") from None
        where = f"the admin key file {path!r}"
    else:
        key, where = environ.get(KEY_VARIABLE, "").strip(), KEY_VARIABLE
    if not key:
        raise ValueError(
            "--from-live needs the router's admin key: give --admin-key-file FILE or set "
            f"{KEY_VARIABLE}" + ("" if path is None else f" ({where} is empty)")
        )
    if not key.isprintable() or any(c.isspace() for c in key):
        raise ValueError(f"{where} holds more than one word: give the key alone")
    return key


def shown(url: str) -> str:
    """A URL as a message may show it: without any ``user:password@``."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    return urlunsplit(parts._replace(netloc=host if parts.port is None else f"{host}:{parts.port}"))


async def fetch_live(url: str, key: str) -> dict[str, Any]:
    """The router's live profile document; a ValueError with the router's own message when
    it refuses, a RuntimeError when it cannot be reached."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--from-live takes the router's URL, http://HOST:PORT: {shown(url)!r}")
    target = url.rstrip("/") + LIVE_PATH
    headers = {"Authorization": f"Bearer {key}"}
    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=SECONDS)) as session,
            session.get(target, headers=headers) as r,
        ):
            status, body = r.status, await r.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        said = str(exc) if key not in str(exc) else ""  # no exception names it, and none may
        raise RuntimeError(
            f"the router at {shown(url)} did not answer: {type(exc).__name__} {said}".strip()
        ) from None
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if status != 200:
        raise ValueError(f"the router refused ({status}): {_message(answer, body)}")
    if (
        not isinstance(answer, dict)
        or (answer.get("crossover") or {}).get("source") != "live"
        or not isinstance(answer.get("measurement"), dict)
    ):
        raise ValueError(f"the answer of {shown(target)} is not a live profile")
    return answer


def _message(answer: Any, body: bytes) -> str:
    """An OpenAI-shaped error's message, or the start of whatever else came."""
    error = answer.get("error") if isinstance(answer, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return body[:300].decode(errors="replace") or "no message"
