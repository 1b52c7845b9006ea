"""``specroute bench overhead --profile-dir DIR``: py-spy's sampling profile of a Python
router's process tree (its workers included) over one window of load, in a pass of its own
after the measured windows, so that the sampling costs none of the figures.

py-spy reads the router's memory from outside without stopping it (``--nonblocking``) and
leaves out threads that wait (an idle event loop), so the profile shows where the router's
CPU goes; it needs the right to trace another process (root, or ``ptrace_scope`` 0).
"""

from __future__ import annotations

import asyncio
import itertools
import shutil
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from specroute.bench.overhead_load import Sampled
from specroute.bench.overhead_targets import Target

Window = Callable[[Target, int, str, Callable[[], None]], Awaitable[Sampled]]

FORMATS = {"speedscope": "speedscope.json", "flamegraph": "svg", "raw": "txt"}
RATE = 250  # samples per second
_STOP_SECONDS = 30.0


def py_spy() -> str | None:
    """py-spy beside this Python (a virtual environment's), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@dataclass
class Profile:
    """py-spy recording ``pid`` and its children from ``start`` until ``stop``."""

    pid: int
    out: Path
    format: str = "speedscope"
    process: subprocess.Popen[bytes] | None = None

    def turn(self) -> None:
        """As the window opens, start; as it closes, stop."""
        if self.process is None:
            self.start()
        else:
            self.stop()

    def start(self) -> None:
        found = py_spy()
        if found is None:
            raise RuntimeError("py-spy is not installed (pip install py-spy)")
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                found,
                "record",
                "--pid",
                str(self.pid),
                "--subprocesses",
                "--nonblocking",
                "--rate",
                str(RATE),
                "--format",
                self.format,
                "--output",
                str(self.out),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )

    def stop(self) -> None:
        """Ctrl-C, as a person stops it: py-spy writes what it sampled and exits."""
        if self.process is not None:
            self.process.send_signal(signal.SIGINT)

    def wait(self) -> str | None:
        """None once the profile is written, else what went wrong."""
        if self.process is None:
            return "py-spy did not start"
        try:
            _, said = self.process.communicate(timeout=_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, said = self.process.communicate()
        if self.out.exists():
            return None
        return said.decode(errors="replace").strip()[-400:] or f"exit {self.process.returncode}"


@dataclass(frozen=True)
class Profiles:
    """Where the profiles go, and in which of py-spy's formats."""

    folder: Path
    format: str = "speedscope"

    def name(self, target: str, mode: str, level: int) -> str:
        return f"{target}-{mode}-{level}.{FORMATS[self.format]}"

    async def record(
        self,
        routers: Sequence[Target],
        levels: Sequence[int],
        modes: Sequence[str],
        window: Window,
        note: Callable[[str], None],
    ) -> list[str]:
        """One window more for each router, level and mode, py-spy recording the router's
        tree over it (from the window's opening to its close); the files written."""
        written = []
        for level, mode, target in itertools.product(levels, modes, routers):
            assert target.pid is not None
            name = self.name(target.name, mode, level)
            profile = Profile(target.pid, self.folder / name, self.format)
            await window(target, level, mode, profile.turn)
            failed = await asyncio.to_thread(profile.wait)
            if failed is not None:
                note(f"no profile of {target.name} {mode} at {level}: {failed}")
                continue
            written.append(name)
        if written:
            note(
                f"py-spy profiles of {', '.join(t.name for t in routers)} at levels "
                f"{', '.join(map(str, levels))}, one window more each (not measured), in "
                f"{self.folder}"
            )
        return written
