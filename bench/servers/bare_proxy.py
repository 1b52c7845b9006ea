"""The floor of a Python proxy: ``python -m specroute.bench.servers.bare_proxy --port P --upstream
URL...`` relays each request to the next upstream in turn and its answer back as the bytes
come, deciding nothing. What a router costs beyond this is its own work."""

from __future__ import annotations

import argparse
import itertools
from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from specroute.event_loop import new_event_loop

SESSION = web.AppKey("session", aiohttp.ClientSession)


def create_app(upstreams: list[str]) -> web.Application:
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

    app.cleanup_ctx.append(session)
    app.router.add_route("*", "/{path:.*}", relay)
    return app


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m specroute.bench.servers.bare_proxy")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--upstream", action="append", required=True, metavar="URL")
    args = p.parse_args()
    app = create_app([u.rstrip("/") for u in args.upstream])
    web.run_app(app, host=args.host, port=args.port, access_log=None, loop=new_event_loop())


if __name__ == "__main__":
    main()
