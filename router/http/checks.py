"""The checks a request passes before the request path, the same on either front (the own
front's ``gate``, aiohttp's ``middleware``): its headers readable, then its key, then its
body whole within ``body_timeout`` (no body is waited for from a stranger), each refused
with one answer. Each front reads the headers and the body its own way; what it checks and
what it answers are here."""

from __future__ import annotations

from aiohttp import web

from specroute.router.admission.auth import Keys
from specroute.router.protocol.asked import Asked
from specroute.router.protocol.errors import error_response


def before_body(readable: bool, keys: Keys, request: Asked) -> web.Response | None:
    """The refusal of a request whose headers do not read as UTF-8 (``readable`` False),
    or whose key is not good; None: on to its body."""
    if not readable:
        return error_response(400, "A header's value is not valid UTF-8.")
    return keys.refusal(request)


def body_late(seconds: float) -> web.Response:
    """The refusal of a body not whole within ``seconds``."""
    return error_response(408, f"The request body took longer than {seconds:g} s.")
