"""The floor of a Python proxy: ``python -m specroute.bench.servers.bare_proxy --port P --upstream
URL... [--workers N]`` relays each request to the next upstream in turn and its answer back
as the bytes come, deciding nothing. What a router costs beyond this is its own work.

With ``--workers N`` it forks N such processes on one port (``SO_REUSEPORT``, as
``specroute serve --workers`` does), which share nothing and do no background work: what
CPU per request does with the process count alone. ``GET /bare/worker`` answers the
index of the process that took the connection."""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import sys
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from specroute.event_loop import new_event_loop

SESSION = web.AppKey("session", aiohttp.ClientSession)


def create_app(upstreams: list[str], worker: int = 0) -> web.Application:
    app, turn = web.Application(), itertools.cycle(upstreams)

    async def session(app: web.Application) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0)  # one connection per request in flight
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as s:
            app[SESSION] = s
            yield

    async def relay(request: web.Request) -> web.StreamResponse:
        headers = {"Content-Type": request.headers.get("Content-Type", "application/json")}
        async with request.app[SESSION].request(
            request.method,
            next(turn) + request.path_qs,
            data=await request.read(),
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=None),
        ) as upstream:
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            async for data in upstream.content.iter_any():
                await response.write(data)
            await response.write_eof()
            return response

    async def which(request: web.Request) -> web.Response:
        return web.json_response({"index": worker})

    app.cleanup_ctx.append(session)
    app.router.add_get("/bare/worker", which)
    app.router.add_route("*", "/{path:.*}", relay)
    return app


def _serve(upstreams: list[str], host: str, port: int, worker: int, shared: bool) -> None:
    web.run_app(
        create_app(upstreams, worker),
        host=host,
        port=port,
        access_log=None,
        loop=new_event_loop(),
        reuse_port=shared,
        print=None,
    )


def _supervise(upstreams: list[str], host: str, port: int, workers: int) -> int:
    """Fork the workers, pass a stop signal on to each, and wait for them all."""
    children = []
    for worker in range(workers):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            _serve(upstreams, host, port, worker, shared=True)
            os._exit(0)
        children.append(pid)

    def forward(sig: int, _: object) -> None:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, sig)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    failed = 0
    for child in children:
        _, status = os.waitpid(child, 0)
        failed += os.waitstatus_to_exitcode(status) not in (0, -signal.SIGTERM)
    return 1 if failed else 0


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m specroute.bench.servers.bare_proxy")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", action="append", required=True, metavar="URL")
    p.add_argument("--workers", type=int, default=1, help="processes on the port")
    args = p.parse_args()
    upstreams = [u.rstrip("/") for u in args.upstream]
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if args.workers == 1:
        _serve(upstreams, args.host, args.port, 0, shared=False)
    else:
        sys.exit(_supervise(upstreams, args.host, args.port, args.workers))


if __name__ == "__main__":
    main()
