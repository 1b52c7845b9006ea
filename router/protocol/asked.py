"""What the router reads of a request, whichever server parsed it: aiohttp's (every path)
or its own front's (the proxied paths, ``router.http.server``). Both meet these protocols, so the
request path is one code whatever carried the request."""

from __future__ import annotations

from typing import Protocol

from multidict import CIMultiDictProxy

from specroute.router.protocol.reply import Reply


class Asked(Protocol):
    """Any request: what its key, its id, its access line and its span read."""

    @property
    def method(self) -> str: ...

    @property
    def path(self) -> str: ...

    @property
    def headers(self) -> CIMultiDictProxy[str]: ...


class Proxied(Asked, Protocol):
    """A request to a proxied path, its body already read whole (the front's gate)."""

    @property
    def content_type(self) -> str: ...

    async def read(self) -> bytes: ...

    def reply(self) -> Reply:
        """Where its answer goes: one for each request."""
        ...
