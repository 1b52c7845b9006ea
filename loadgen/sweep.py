"""``specroute bench sweep``: both backends across concurrency levels, kept raw in a folder.

Each level is measured ``repeats`` times per backend, the two backends alternating which
goes first so drift on the machine hits both alike. The folder holds ``meta.json`` (both
servers' ``server_info``, the dataset, the settings, fairness warnings), ``levels.jsonl``
(one line per level run) and ``requests.jsonl`` (every request, chunk by chunk).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

from specroute.loadgen import lag
from specroute.loadgen.client import request_body, served_model
from specroute.loadgen.closed_loop import LevelRun, run_level
from specroute.loadgen.dataset import Dataset
from specroute.loadgen.fairness import banner, fairness_notes, fairness_warnings, server_info
from specroute.loadgen.progress import Progress
from specroute.loadgen.prompt_fit import fitted

SCHEMA = "specroute.sweep/v1"
BACKENDS = ("spec", "base")
RETRY_PAUSE = 2.0  # seconds: a machine busy for a moment may be quiet again


@dataclass(frozen=True)
class SweepPlan:
    spec: str
    base: str
    dataset: Dataset
    repeats: int = 3
    requests: int | None = None  # per level and run; None: duration, or 2x level (>= 16)
    duration: float | None = None
    ignore_eos: bool = True
    slo: dict[str, float] = field(default_factory=dict)  # ttft, tpot in seconds
    api_key: str | None = None

    def requests_at(self, level: int) -> int | None:
        if self.duration is not None:
            return None
        return self.requests if self.requests is not None else max(16, 2 * level)


class Sweep:
    """An open sweep folder: ``measure(level)`` adds a level; closing writes the totals."""

    def __init__(self, plan: SweepPlan, out: Path, progress: Progress | None = None) -> None:
        self.plan, self.out, self.progress = plan, out, progress
        self.runs: list[LevelRun] = []
        self.backend_seconds = 0.0  # backend time spent measuring: the sweep's cost
        self.meta: dict[str, Any] = {}
        self._session: aiohttp.ClientSession | None = None
        self._bodies: Iterator[dict[str, Any]] = iter(())
        self._sent_bytes: list[int] = []  # the text bytes of each body the run drew, in order
        self._order = itertools.count()
        self.repeats: dict[int, int] = {}  # level: runs per backend so far, numbered on
        self.last_lag: float | None = None  # how far the last run's server fell behind

    @property
    def headers(self) -> dict[str, str] | None:
        key = self.plan.api_key
        return None if key is None else {"Authorization": f"Bearer {key}"}

    async def __aenter__(self) -> Sweep:
        self.out.mkdir(parents=True, exist_ok=True)
        for name in ("levels.jsonl", "requests.jsonl"):
            (self.out / name).write_text("")
        connector = aiohttp.TCPConnector(limit=0)
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=300)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=self.headers
        )
        plan, session = self.plan, self._session
        infos = {
            "spec": await server_info(session, plan.spec),
            "base": await server_info(session, plan.base),
        }
        warnings = fairness_warnings(infos["spec"], infos["base"])
        notes = fairness_notes(infos["spec"], infos["base"])
        if self.progress is not None:
            if warnings:
                self.progress.note(banner(warnings))
            for said in notes:
                self.progress.note(f"fairness check: {said}")
        model = await served_model(session, plan.spec)
        note = self.progress.note if self.progress is not None else _quiet
        fit = await fitted(session, plan.spec, model, plan.dataset, note)
        self.plan = plan = replace(plan, dataset=fit)  # prompts in the server's tokens
        self._bodies = self._drawn(model)
        self.meta = {
            "schema": SCHEMA,
            "started": datetime.now(UTC).isoformat(timespec="seconds"),
            "model": model,
            "spec": {"url": plan.spec, "server_info": infos["spec"]},
            "base": {"url": plan.base, "server_info": infos["base"]},
            "fairness_warnings": warnings,
            "fairness_notes": notes,
            "dataset": plan.dataset.describe(),
            "settings": {
                k: v
                for k, v in asdict(plan).items()
                if k not in ("dataset", "api_key", "spec", "base")
            },
        }
        self._write_meta()
        return self

    def _drawn(self, model: str) -> Iterator[dict[str, Any]]:
        """The dataset's prompts as request bodies, round and round, each one's text bytes
        noted as it is drawn: the closed loop draws a body right after making its record,
        so the n-th body drawn in a run is the n-th record's."""
        for prompt in itertools.cycle(self.plan.dataset.prompts):
            self._sent_bytes.append(prompt.text_bytes)
            yield request_body(prompt, model, self.plan.ignore_eos)

    async def measure(self, level: int, repeats: int | None = None) -> list[LevelRun]:
        """Both backends at one level, ``repeats`` more times (the plan's by default),
        alternating which goes first. Runs of a level measured again are numbered on from
        the ones before, so each run keeps its own ``repeat``: the bootstrap's unit."""
        runs = []
        done = self.repeats.get(level, 0)
        for repeat in range(done, done + (self.plan.repeats if repeats is None else repeats)):
            first = next(self._order) % 2
            for backend in (BACKENDS[first], BACKENDS[1 - first]):
                runs.append(await self._timed_run(backend, level, repeat))
            self.repeats[level] = repeat + 1
        self.runs += runs
        return runs

    async def _timed_run(self, backend: str, level: int, repeat: int) -> LevelRun:
        """One run that kept its time: one whose emulated server fell behind its time scale
        by more than ``lag.LIMIT`` is said, left out, and run again after a pause; a second
        such run stops the sweep (``LagError``), since nothing can be concluded from it."""
        for attempt in (1, 2):
            if self.progress is not None:
                self.progress.begin(backend, level, repeat)
            run, seconds = await self.run_one(backend, level, repeat)
            self.backend_seconds += seconds
            behind = self.last_lag
            if behind is None or behind <= lag.LIMIT:
                self._append(run, seconds, behind)
                if self.progress is not None:
                    self.progress.end(run, seconds)
                return run
            said = (
                f"the emulated {backend} server ran {behind:.0%} behind its time scale at "
                f"concurrency {level}: the machine, not the model, set the pace"
            )
            if attempt == 2:
                raise lag.LagError(
                    f"{said}, twice; {lag.CONCLUDED_NOTHING}. Calibrate again with a "
                    "slower --time-scale on both servers, fewer requests at once "
                    "(--max-concurrency), or on a quieter machine."
                )
            if self.progress is not None:
                self.progress.note(f"{said}; the run is left out and tried again")
            await asyncio.sleep(RETRY_PAUSE)
        raise AssertionError("unreachable")

    async def run_one(self, backend: str, level: int, repeat: int) -> tuple[LevelRun, float]:
        """One closed-loop run and the backend time it took; ``last_lag`` says how far an
        emulated server fell behind its time scale meanwhile."""
        assert self._session is not None, "use the sweep as an async context manager"
        plan = self.plan
        url = plan.spec if backend == "spec" else plan.base
        before = await lag.clock(self._session, url)
        started = time.monotonic()
        self._sent_bytes = []
        run = await run_level(
            self._session,
            url,
            self._bodies,
            backend=backend,
            level=level,
            repeat=repeat,
            requests=plan.requests_at(level),
            duration=plan.duration,
            on_record=None if self.progress is None else self.progress.record,
        )
        for record, size in zip(run.records, self._sent_bytes, strict=True):
            record.prompt_bytes = size
        seconds = time.monotonic() - started
        self.last_lag = lag.lag(before, await lag.clock(self._session, url))
        return run, seconds

    def _append(self, run: LevelRun, seconds: float, behind: float | None = None) -> None:
        line = run.summary() | {"seconds": round(seconds, 3)}
        if behind is not None:
            line["emulator_lag"] = round(behind, 4)
        with (self.out / "levels.jsonl").open("a") as f:
            f.write(json.dumps(line) + "\n")
        with (self.out / "requests.jsonl").open("a") as f:
            for record in run.records:
                f.write(json.dumps(record.as_json()) + "\n")

    def _write_meta(self) -> None:
        (self.out / "meta.json").write_text(json.dumps(self.meta, indent=1) + "\n")

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.meta |= {
            "ended": datetime.now(UTC).isoformat(timespec="seconds"),
            "levels": sorted({r.level for r in self.runs}),
            "backend_seconds": self.backend_seconds,
            "complete": kind is None,
        }
        self._write_meta()
        if self._session is not None:
            await self._session.close()


def _quiet(_: str) -> None:
    """A note nobody reads: a sweep without progress."""


async def sweep(plan: SweepPlan, levels: list[int], out: Path) -> Sweep:
    progress = Progress(len(levels) * plan.repeats * len(BACKENDS))
    async with Sweep(plan, out, progress) as run:
        for level in levels:
            await run.measure(level)
    return run
