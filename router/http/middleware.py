"""What every request passes before a handler sees it, in one middleware (each layer of
aiohttp's middleware costs every request a coroutine of its own): its headers readable,
its key, its body read whole in time; and what a client sent wrong answered as an
OpenAI-shaped error, never a 500."""

from __future__ import annotations

import asyncio
import codecs
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.typedefs import Middleware

from specroute.router.admission.auth import Keys
from specroute.router.http.checks import before_body, body_late
from specroute.router.observability.lifecycle import Lifecycle
from specroute.router.observability.record import RECORD, ended, opened
from specroute.router.protocol.errors import error_response

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def front(
    keys: Keys,
    body_seconds: float,
    request_id_headers: list[str],
    lifecycle: Lifecycle,
) -> Middleware:
    """The app's one middleware: outermost, the request's record opened and, when it ends,
    told to every request's listeners (``Lifecycle.ended``: its access line among them);
    within, the gate."""

    @web.middleware
    async def gate(request: web.Request, handler: Handler) -> web.StreamResponse:
        request[RECORD] = record = opened(request, request_id_headers)
        status: int | None = None
        response: web.StreamResponse
        try:
            try:
                values = request.headers.values()
                # readable: none of the router's reads of the headers fails
                readable = "".join(values).isascii() or all(_utf8(value) for value in values)
                refused = before_body(readable, keys, request) or await _whole_body(
                    request, body_seconds
                )
                response = refused or await handler(request)
            except (
                web.HTTPRequestEntityTooLarge,
                web.HTTPNotFound,
                web.HTTPMethodNotAllowed,
                RecursionError,
                LookupError,
            ) as exc:
                answer = _client_error(request, exc)
                if answer is None:
                    raise  # a KeyError or an IndexError: the router's own bug, aiohttp answers 500
                response = answer
            status = response.status
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        except asyncio.CancelledError:  # the client went away: no status was answered
            raise
        except Exception:  # the router's own failure: aiohttp answers 500
            status = 500
            raise
        finally:
            try:
                lifecycle.ended(record, request, status)
            finally:
                ended(record)

    return gate


def _client_error(request: web.Request, exc: BaseException) -> web.Response | None:
    """What a client sent wrong, as an OpenAI-shaped error; None: not the client's."""
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        refused = error_response(413, f"The request body is larger than the limit: {exc.text}")
        refused.force_close()  # the rest of the body is not read: the connection ends
        return refused
    if isinstance(exc, web.HTTPNotFound):
        return error_response(404, f"Unknown path {request.path!r}.", "not_found")
    if isinstance(exc, web.HTTPMethodNotAllowed):
        allowed = {"Allow": ", ".join(sorted(exc.allowed_methods))}  # RFC 9110
        said = f"{request.method} is not allowed on {request.path!r}."
        return error_response(405, said, headers=allowed)
    if isinstance(exc, RecursionError):  # decoding a client's JSON: the only deep recursion
        return error_response(400, "The request body nests too deeply to be read.")
    if _known_charset(request.charset):
        return None
    return error_response(400, f"Unknown charset {request.charset!r} in Content-Type.")


def _utf8(value: str) -> bool:
    """aiohttp keeps a header's bytes that are not UTF-8 as lone surrogates, which fail
    whatever encodes the value again (a key's comparison, a forwarded header)."""
    try:
        return value.isascii() or bool(value.encode())
    except UnicodeEncodeError:
        return False


def _known_charset(charset: str | None) -> bool:
    try:
        return charset is None or codecs.lookup(charset) is not None
    except LookupError:
        return False


async def _whole_body(request: web.Request, seconds: float) -> web.Response | None:
    """The body read whole, within ``seconds``, once the key is known good (no body is held
    for a stranger): a client that sends slowly holds its connection that long at most, and
    a body that cannot be read is the client's error (408, 400; 413 past ``max_body_bytes``),
    never the router's. The handler's own read returns what was read here."""
    if request.content.is_eof():  # the body came whole with the head: nothing to wait for
        await request.read()
    elif request.can_read_body:
        try:
            async with asyncio.timeout(seconds):
                await request.read()
        except TimeoutError:
            late = body_late(seconds)
            late.force_close()
            return late
        except web.RequestPayloadError as exc:  # a bad chunk, a bad compressed body
            cause = exc.__cause__
            said = cause.message if isinstance(cause, HttpProcessingError) else str(exc)
            return error_response(400, f"The request body could not be read: {said}")
    return None
