"""The runner that serves the router: aiohttp's, but a request whose head aiohttp cannot
parse (a header past ``max_header_bytes``, too many headers, a malformed line) or that
fails unexpectedly is answered as an OpenAI-shaped error like every other, not in
aiohttp's plain text, which quotes the bad line back, an ``Authorization`` key in it too."""

from __future__ import annotations

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, LineTooLong
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from specroute.router.protocol.errors import error_response


class _Handler(RequestHandler):
    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        super().handle_error(request, status, exc, message)  # logs it (the line left out)
        response = parse_refusal(status, exc)
        response.force_close()
        return response


def parse_refusal(status: int, exc: BaseException | None) -> web.Response:
    """A request the server could not take, or failed on (500), named by the exception's
    kind and its limit, never by its message or the line."""
    if isinstance(exc, LineTooLong):
        limit = exc.args[1] if len(exc.args) > 1 else "its"
        said = f"A line of the request head is longer than {limit} bytes."
        return error_response(431, said)
    if isinstance(exc, BadHttpMessage) or status == 400:
        name = type(exc).__name__ if exc is not None else "BadHttpMessage"
        return error_response(400, f"The request could not be parsed ({name}).")
    if status == 504:
        return error_response(504, "The router timed out on this request.", "timeout")
    return error_response(500, "The router failed on this request.", "internal_error")


class _Server(web.Server):
    def __call__(self) -> RequestHandler:
        return _Handler(self, loop=self._loop, **self._kwargs)


class RouterRunner(web.AppRunner):
    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _Server  # the same server; its connections get _Handler
        return server
