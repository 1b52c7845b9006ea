"""Run the router until SIGTERM or SIGINT, then drain as load balancers expect: ``/ready``
turns 503 at once while new requests are still served for ``drain_grace`` seconds (the time
it takes to be removed from a Service's endpoints; none after SIGINT, a person at a
terminal), then new requests are refused and those in flight get up to ``drain_timeout``
seconds to finish. A second signal stops at once."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import resource
import signal
import sys
import time

from specroute import logs
from specroute.event_loop import run as run_loop
from specroute.router.admission.auth import without_credentials
from specroute.router.app import create_app
from specroute.router.http.runner import RouterRunner
from specroute.router.http.server import DRAIN, site
from specroute.router.processes import Workers, supervise
from specroute.router.settings import RouterSettings
from specroute.router.state import STATE, RouterState

_DRAIN_POLL = 0.05
_CUT_OFF_GRACE = 1.0


def run(settings: RouterSettings) -> int:
    print(f"specroute router: {open_files_limit()}", flush=True)
    if settings.workers == 1:
        run_loop(serve(settings))
        return 0
    return supervise(settings, lambda s, workers: run_loop(serve(s, workers)))


def open_files_limit() -> str:
    """Raise the soft limit of open files to the hard one: every stream holds two sockets,
    and a shell's common default of 1,024 runs out near 500 streams."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft >= hard:
        return f"open files limit {soft}"
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        return f"open files limit {soft} (raising it to {hard} failed: {exc})"
    return f"open files limit raised from {soft} to {hard}"


async def serve(settings: RouterSettings, workers: Workers | None = None) -> None:
    """One router, alone or as one of ``workers`` on the same port."""
    logs.configure(log_format=settings.observability.log_format)  # in each worker's process too
    app = create_app(settings, workers)
    runner = RouterRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=DRAIN)
    await runner.setup()
    try:
        await site(
            runner, settings, settings.http.host, settings.http.port, workers is not None
        ).start()
        quiet_collector()
        short_turns()
        who = f"worker {workers.board.worker}" if workers is not None else "router"
        print(
            f"specroute {who} on http://{settings.http.host}:{settings.http.port}: "
            f"spec {', '.join(map(without_credentials, settings.backends.spec))}; "
            f"base {', '.join(map(without_credentials, settings.backends.base))}",
            flush=True,
        )
        stop = asyncio.Event()
        signals: list[signal.Signals] = []

        def on_signal(sig: signal.Signals) -> None:
            signals.append(sig)
            stop.set()

        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, on_signal, sig)
        await stop.wait()
        stop.clear()
        grace = settings.drain_grace if signals[0] == signal.SIGTERM else 0.0
        await drain(app[STATE], grace, settings.drain_timeout, stop)
    finally:
        await runner.cleanup()


YOUNG = 50_000  # objects made and not freed before the cyclic collector runs (default 700)


def quiet_collector() -> None:
    """What start-up made (modules, settings, the app) lives as long as the process: out of
    the collector's sight, a full collection no longer walks its ~50,000 objects, a pause
    (16 ms, measured at start-up) in every stream at once. And the request path leaves
    nothing in reference cycles, so the collector has next to nothing to find: at the
    default threshold it still ran ten times a second under load (256 streams), walking
    the objects of every stream in flight, pauses of up to 5 ms, 1% of the time. It now
    runs once ``YOUNG`` objects more have been made than freed: the little cyclic garbage
    there is (a closed connection's parser) waits that long, and no longer."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG, *gc.get_threshold()[1:])


TURN = 0.0005  # seconds a thread runs on while another waits for the interpreter (default 0.005)


def short_turns() -> None:
    """The online fit runs in a thread beside the event loop (``tasks.online_fits.fit_now``):
    while it does, a loop that wakes waits at most ``TURN`` for the interpreter's lock,
    not the default 5 ms, every request of the worker behind it."""
    sys.setswitchinterval(TURN)


async def drain(state: RouterState, grace: float, seconds: float, again: asyncio.Event) -> None:
    """Say not ready but serve on for ``grace`` seconds; then refuse new work and wait for
    the in-flight count to reach 0, ``seconds``, or a second signal; then cut off what is
    left, each stream ending with an event saying why."""
    state.stopping = True
    if grace > 0:
        print(
            f"specroute router: not ready; serving {grace:g} s more while load balancers "
            "take it out",
            flush=True,
        )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(again.wait(), grace)
    state.draining = True
    state.admission.shut()
    print(
        f"specroute router: draining {state.inflight()} request(s), up to {seconds:g} s", flush=True
    )
    await _until_idle(state, seconds, again)
    left = state.relaying.cut()
    await _until_idle(state, _CUT_OFF_GRACE, again)
    print(f"specroute router: stopped, {left} request(s) cut off", flush=True)


async def _until_idle(state: RouterState, seconds: float, again: asyncio.Event) -> None:
    deadline = time.monotonic() + seconds
    while state.inflight() and time.monotonic() < deadline and not again.is_set():  # noqa: ASYNC110
        await asyncio.sleep(_DRAIN_POLL)  # the count moves in every handler: polled, not signalled
