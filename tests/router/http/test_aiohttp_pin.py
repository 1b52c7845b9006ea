"""The router's HTTP front reaches past aiohttp's public API (``router/http/runner.py``,
``router/http/server.py``, ``router/protocol/reply.py``), so aiohttp is pinned to one minor
(``pyproject.toml``): this fails on an aiohttp the front was not built for, naming the pin
to move, and checks each private name the front relies on is still where it reads it."""

from __future__ import annotations

import inspect
import re
import tomllib
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.web_protocol import RequestHandler

ROOT = Path(__file__).parents[3]


def _pinned() -> tuple[int, int]:
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if d.startswith("aiohttp"))
    found = re.fullmatch(r"aiohttp>=(\d+)\.(\d+),<(\d+)\.(\d+)", spec)
    assert found, f"aiohttp is not pinned to one minor: {spec}"
    major, minor, below_major, below_minor = map(int, found.groups())
    assert (below_major, below_minor) == (major, minor + 1), spec
    return major, minor


def test_the_installed_aiohttp_is_the_minor_the_front_was_built_on() -> None:
    major, minor = _pinned()
    installed = tuple(int(x) for x in aiohttp.__version__.split(".")[:2])
    assert installed == (major, minor), (
        f"aiohttp {aiohttp.__version__} is installed; the front was built on {major}.{minor}: "
        "run the HTTP tests on the new one, then move the pin in pyproject.toml"
    )


def test_the_private_names_the_front_reads_are_there() -> None:
    assert inspect.iscoroutinefunction(web.AppRunner._make_server)
    server = inspect.getsource(web.Server.__init__)
    site = inspect.getsource(web.TCPSite.__init__) + inspect.getsource(web.BaseSite.__init__)
    for source, names in (
        (server, ("_loop", "_kwargs")),
        (site, ("_runner", "_backlog", "_host", "_port", "_reuse_port", "_server")),
    ):
        for name in names:
            assert f"self.{name}" in source, name
    assert "_bound_port" in inspect.getsource(web.TCPSite)
    assert "_send_headers_immediately" in inspect.getsource(web.StreamResponse)
    assert "handle_error" in vars(RequestHandler)
