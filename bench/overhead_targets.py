"""What ``specroute bench overhead`` puts between its clients and two stub backends, each
started by the project's one spawner as a process of its own on loopback:

- ``direct``: nothing; the clients talk to the backends (client ``i`` to backend ``i % 2``);
- ``bare``: ``specroute.bench.servers.bare_proxy``, a pass-through in Python that decides nothing;
  ``bare-wN`` the same forked into N processes on one port, for each count of
  ``--bare-workers`` above 1: what more processes cost a router that does no background work;
- ``lean`` (``--lean``): ``specroute.bench.servers.lean_proxy``, the same pass-through on a
  bare asyncio protocol and the router's own upstream client: bare less lean is what
  aiohttp's server side costs a request;
- ``specroute-wN``: ``specroute serve`` with both stub backends in its speculative pool and
  ``--policy-param crossover=1e9`` (every request goes there, through the whole routing path,
  and to the less loaded of the two: spread over them as direct's and the gateways' are; a
  third stub, which nothing reaches, is its plain pool), with N worker processes and no
  access log (the gateways run at log level ``warn``: no line for each request either);
  online calibration at its default, ``observe`` (a stream asks for its token counts, so
  each one is a sample); with ``--online-off``, also ``specroute-w1-online-off``, one worker
  with ``--online off``: what learning from live traffic costs; with ``--aiohttp-front``,
  also ``specroute-w1-aiohttp``, one worker with ``--front aiohttp``: what the own front saves;
  with ``--one-backend``, also ``specroute-wN-one-backend`` for each N, every request on the
  first stub, the second its plain pool: the bench's former arrangement, whose first
  chunks waited in the one busier backend as well as in the router; with ``--baseline
  DIR``, also ``specroute-wN-baseline`` for each N: the same router from another version of
  specroute (``pip install --target DIR`` of its wheel), its windows taking turns with this
  version's on the same machine, so that a change's cost is read within one run;
- the gateways in Rust named by ``--gateways``, round robin, each when installed: ``smg``
  (SGLang's current gateway, the optional extra ``overhead``) and ``sglang-router`` (its
  predecessor).
"""

from __future__ import annotations

import asyncio
import importlib.util
import re
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass

import aiohttp

from specroute.loadgen.spawn import NO_DRAIN, free_port, spawned

STUB = "specroute.bench.servers.stub_backend"
BARE = "specroute.bench.servers.bare_proxy"
LEAN = "specroute.bench.servers.lean_proxy"
_WORKER_TRIES = 500
ONLINE_OFF = "-online-off"  # a specroute target's suffix: served with --online off
AIOHTTP_FRONT = "-aiohttp"  # a specroute target's suffix: served with --front aiohttp
BASELINE = "-baseline"  # a specroute target's suffix: served by the code in --baseline DIR


@dataclass(frozen=True)
class Gateway:
    """A router in Rust that ``bench overhead`` compares against: started as ``python -m
    MODULE`` with sglang-router's flags (smg kept them), round robin over both backends."""

    package: str  # the Python package it installs
    module: str
    install: str
    ready: str = "/readiness"


GATEWAYS = {
    "smg": Gateway("smg", "smg.launch_router", "pip install 'specroute[overhead]'"),
    "sglang-router": Gateway(
        "sglang_router", "sglang_router.launch_router", "pip install sglang-router==0.3.2"
    ),
}


@dataclass(frozen=True)
class Target:
    name: str
    urls: tuple[str, ...]  # where its clients send: the router, or the backends themselves
    pid: int | None  # the router's process, its workers below it; None for direct


async def _every_worker_listening(url: str, workers: int, bare: bool = False) -> None:
    """Until each worker has answered on a connection of its own: the first one ready does
    not make the others so, and connections opened before a worker listens never reach it."""
    seen: set[int] = set()
    path = "/bare/worker" if bare else "/router/status"
    for _ in range(_WORKER_TRIES):
        async with aiohttp.ClientSession() as s, s.get(url + path) as r:
            answer = await r.json()
            seen.add(answer["index"] if bare else answer["worker"]["index"])
        if len(seen) == workers:
            return
        await asyncio.sleep(0.01)
    raise RuntimeError(f"only workers {sorted(seen)} of {workers} answered at {url}")


def named(family: str, workers: int) -> str:
    """The target of ``family`` (``bare`` or ``specroute``) served by ``workers``
    processes: ``counted`` reads it back."""
    return "bare" if (family, workers) == ("bare", 1) else f"{family}-w{workers}"


_COUNTED = re.compile(r"(bare)(?:-w(\d+))?|(specroute)-w(\d+)")  # bare, bare-wN, specroute-wN


def counted(name: str) -> tuple[str, int] | None:
    """``bare`` or ``specroute`` and its count of processes, for a target that is one of
    them at a count (``bare``, ``bare-wN``, ``specroute-wN``); None for any other (direct, a
    gateway, one served with other flags)."""
    found = _COUNTED.fullmatch(name)
    if found is None:
        return None
    if found.group(1):
        return "bare", int(found.group(2) or 1)
    return "specroute", int(found.group(4))


def family(name: str) -> str | None:
    """``counted``'s name of the target, alone."""
    found = counted(name)
    return None if found is None else found[0]


def is_profiled(name: str) -> bool:
    """Whether ``--profile-dir`` samples this target: the one-process bare pass-through, the
    floor, and each ``specroute-wN``."""
    return name == "bare" or family(name) == "specroute"


def installed(gateway: str) -> bool:
    return importlib.util.find_spec(GATEWAYS[gateway].package) is not None


@dataclass(frozen=True)
class Backends:
    """The stub backends: the two that every target's requests go to, and a third that none
    goes to (``idle``), specroute's plain pool."""

    urls: tuple[str, str]
    pids: tuple[int, int]
    idle: str
    idle_pid: int


ONE_BACKEND = "-one-backend"  # a specroute target's suffix: every request on the first stub


async def start_backends(stack: AsyncExitStack, chunks: int, gap_ms: float) -> Backends:
    flags = ("--chunks", str(chunks), "--gap-ms", f"{gap_ms:g}")
    stubs = [await stack.enter_async_context(spawned(*flags, module=STUB)) for _ in range(3)]
    first, second, idle = stubs
    return Backends(
        (first.url, second.url), (first.process.pid, second.process.pid), idle.url, idle.process.pid
    )


def _serves(
    workers: Sequence[int],
    spread: tuple[str, ...],
    stubs: tuple[str, str],
    baseline: bool,
    online_off: bool,
    aiohttp_front: bool,
    one_backend: bool,
) -> list[tuple[str, int, tuple[str, ...]]]:
    """Each ``specroute serve`` target: its name, its workers and its backends' flags."""
    serves = [(named("specroute", n), n, spread) for n in workers]
    if baseline:  # the same, served by the other version's code
        serves += [(named("specroute", n) + BASELINE, n, spread) for n in workers]
    if online_off:
        serves.append((named("specroute", 1) + ONLINE_OFF, 1, (*spread, "--online", "off")))
    if aiohttp_front:
        serves.append((named("specroute", 1) + AIOHTTP_FRONT, 1, (*spread, "--front", "aiohttp")))
    if one_backend:
        one = ("--spec", stubs[0], "--base", stubs[1])
        serves += [(named("specroute", n) + ONE_BACKEND, n, one) for n in workers]
    return serves


async def start_targets(
    stack: AsyncExitStack,
    backends: Backends,
    workers: Sequence[int],
    gateways: Sequence[str],
    note: Callable[[str], None],
    bare_workers: Sequence[int] = (1,),
    online_off: bool = False,
    lean: bool = False,
    aiohttp_front: bool = False,
    one_backend: bool = False,
    baseline: str | None = None,
) -> list[Target]:
    """Every target the flags ask for, in a fixed order; a gateway that is not installed
    is skipped with a note that says how to install it."""
    first, second = backends.urls
    spread = ("--spec", first, "--spec", second, "--base", backends.idle)
    targets = [Target("direct", backends.urls, None)]
    floors: list[tuple[str, str, int, tuple[str, ...]]] = [
        (named("bare", n), BARE, n, ("--workers", str(n))) for n in bare_workers
    ]
    if lean:
        floors.append(("lean", LEAN, 1, ()))
    for name, module, n, more in floors:
        upstreams = ("--upstream", first, "--upstream", second, *more)
        floor = await stack.enter_async_context(spawned(*upstreams, module=module))
        await _every_worker_listening(floor.url, n, bare=True)
        targets.append(Target(name, (floor.url,), floor.process.pid))
    extras = (baseline is not None, online_off, aiohttp_front, one_backend)
    serves = _serves(workers, spread, (first, second), *extras)
    for name, n, more in serves:
        flags = (
            "serve",
            "--policy-param",
            "crossover=1e9",
            *NO_DRAIN,
            "--drain-timeout",
            "1",
            "--no-access-log",  # as the gateways run: no line for each request
        )
        path = baseline if name.endswith(BASELINE) else None
        router = await stack.enter_async_context(
            spawned(*flags, *more, "--workers", str(n), ready="/ready", path=path)
        )
        await _every_worker_listening(router.url, n)
        targets.append(Target(name, (router.url,), router.process.pid))
    for name in gateways:
        gateway = GATEWAYS[name]
        if not installed(name):
            note(f"{name} skipped: it is not installed ({gateway.install})")
            continue
        options = (
            "--worker-urls",
            *backends.urls,
            "--policy",
            "round_robin",
            "--host",
            "127.0.0.1",
            "--prometheus-host",
            "127.0.0.1",
            "--prometheus-port",
            str(free_port()),
            "--log-level",
            "warn",
            "--shutdown-grace-period-secs",
            "1",
        )
        router = await stack.enter_async_context(
            spawned(*options, module=gateway.module, ready=gateway.ready)
        )
        targets.append(Target(name, (router.url,), router.process.pid))
    return targets
