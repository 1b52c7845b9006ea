"""What a long sweep shows while it runs: a live line per level on a terminal, and one
summary line per finished level anywhere."""

from __future__ import annotations

import statistics
import sys
import time
from typing import TextIO

from specroute.loadgen.closed_loop import LevelRun
from specroute.loadgen.record import RequestRecord


class Progress:
    def __init__(self, total: int, stream: TextIO = sys.stderr) -> None:
        self.total, self.done, self.stream = total, 0, stream
        self.live = stream.isatty()
        self._started = time.monotonic()
        self._label = ""
        self._finished = 0

    def begin(self, backend: str, level: int, repeat: int) -> None:
        self._label = (
            f"[{self.done + 1:>3}/{self.total}] level {level:>4} {backend:<4} rep {repeat}"
        )
        self._finished = 0
        self._show(f"{self._label}: warming up")

    def record(self, record: RequestRecord) -> None:
        self._finished += 1
        if self.live:
            self._show(f"{self._label}: {self._finished} requests done")

    def end(self, run: LevelRun, seconds: float) -> None:
        tpots = [t for r in run.measured if (t := r.tpot()) is not None]
        tpot = f"TPOT {statistics.median(tpots) * 1000:.1f} ms" if tpots else "no TPOT"
        accept = f", accept {run.accept_length:.2f}" if run.accept_length else ""
        flag = "" if run.valid else "  INVALID"
        summary = (
            f"{len(run.measured)} measured, {tpot}, {run.output_tps():.0f} tok/s{accept}, "
            f"{run.failures} failed"
        )
        self.finish(summary, seconds, flag)

    def finish(self, summary: str, seconds: float, flag: str = "") -> None:
        """A level's closing line: what it measured, how long it took, the time left."""
        self.done += 1
        eta = (time.monotonic() - self._started) / self.done * (self.total - self.done)
        self._show(
            f"{self._label}: {summary} ({seconds:.1f} s, ~{eta:.0f} s left){flag}", final=True
        )

    def note(self, text: str) -> None:
        self._show(text, final=True)

    def _show(self, text: str, final: bool = False) -> None:
        if self.live:
            self.stream.write("\r\033[K" + text + ("\n" if final else ""))
        elif final:
            self.stream.write(text + "\n")
        self.stream.flush()
