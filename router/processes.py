"""``specroute serve --workers N``: N router processes on one port with one view of load.

The parent makes the shared board, admission's quota, the rings of online samples and the
metrics folder, then forks the workers, each a whole router binding the port with
``SO_REUSEPORT`` (the kernel spreads connections over them), and from then on only
supervises. A signal it gets goes to every worker, and each
drains as one router would. A worker that dies is started again in its place, its slots on
the board cleared first; one that dies at start (a port taken, a bad profile) stops them all.

Workers run in a process group of their own, so that a terminal's Ctrl-C reaches them once,
through the parent, and they are told to stop if the parent dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from prometheus_client import values

from specroute.online.estimator import OnlineMode
from specroute.router.admission.quota import Quota
from specroute.router.online.rings import Rings
from specroute.router.settings import RouterSettings
from specroute.router.workers.board import Board

_AT_START = 5.0  # a worker that dies sooner than this never served: a fault of the setup
_PR_SET_PDEATHSIG = 1


def quota_of(settings: RouterSettings) -> Quota:
    """The router's: its limit, a bucket for each name a key may go by (``Keys.names``)."""
    return Quota(
        settings.workers,
        settings.admission.max_concurrent_requests,
        len(settings.admission.api_keys) + 2,
    )


@dataclass(frozen=True)
class Workers:
    """What a worker shares with the others."""

    board: Board
    folder: Path  # prometheus_client's multiprocess files, and the profile posted last
    quota: Quota  # admission's slots, queues and rate buckets
    rings: Rings | None = None  # each worker's online samples, for the leader (online on)


Serve = Callable[[RouterSettings, Workers], None]


def supervise(settings: RouterSettings, serve: Serve) -> int:
    folder = Path(tempfile.mkdtemp(prefix="specroute-workers-"))
    board = Board(settings.workers, settings.backends.columns())
    off = settings.online.mode is OnlineMode.OFF
    rings = None if off else Rings(settings.workers, settings.online.kept())
    workers = Workers(board, folder, quota_of(settings), rings)
    children: dict[int, tuple[int, float]] = {}  # pid: (worker, when it started)
    stopping: list[int] = []

    def forward(sig: int, frame: FrameType | None) -> None:
        stopping.append(sig)
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    print(f"specroute router: {settings.workers} workers on port {settings.http.port}", flush=True)
    for worker in range(settings.workers):
        children[_fork(worker, settings, workers, serve)] = (worker, time.monotonic())
    failed = 0
    try:
        while children:
            pid, status = os.wait()
            worker, started = children.pop(pid)
            code = os.waitstatus_to_exitcode(status)
            if stopping:
                failed = failed or (code not in (0, -signal.SIGTERM, -signal.SIGINT))
                continue
            if time.monotonic() - started < _AT_START:
                print(
                    f"specroute router: worker {worker} exited at start ({code}); stopping",
                    file=sys.stderr,
                    flush=True,
                )
                forward(signal.SIGINT, None)  # the others drain with no grace
                failed = 1
                continue
            print(
                f"specroute router: worker {worker} exited ({code}); starting it again",
                file=sys.stderr,
                flush=True,
            )
            workers.board.forget(worker)
            workers.quota.forget(worker)
            children[_fork(worker, settings, workers, serve)] = (worker, time.monotonic())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return 1 if failed else 0


def _fork(worker: int, settings: RouterSettings, workers: Workers, serve: Serve) -> int:
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.setpgid(0, 0)
        _stop_with_parent()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)  # the worker's loop sets its own
        workers.board.become(worker)
        workers.quota.become(worker)
        if workers.rings is not None:
            workers.rings.become(worker)
        # counts from now on go to this process's files in the shared folder
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(workers.folder)
        values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
        serve(settings, workers)
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _stop_with_parent() -> None:
    """Linux: SIGTERM this worker when the parent dies, so that none outlives it."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
