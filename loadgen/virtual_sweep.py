"""A sweep in virtual time: the emulator's engine driven by the closed loop's rules, with
no server and no clock, written to the same folder a live sweep writes.

Each run is the live closed loop's: clients start one after another, each once the one
before has its first token; the window opens when every client has finished one request;
the measured requests are the first ``requests`` to start after that, and the loop stays
full until the last of them ends. A finished request's replacement joins the batch after
the next, as with a live SGLang scheduler. Each run gets an engine of its own, seeded by
the sweep's seed, the level and the repeat, so its noise (``--noise``) is a run's. Its
requests carry the text bytes of the plan's prompts, drawn in turn as a live run draws
them, so the tokens per byte a profile records come out as a live sweep's would.
"""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import Any

from specroute.emulator.config import EmulatorConfig
from specroute.emulator.virtual import ClosedLoop
from specroute.loadgen.closed_loop import CANCELLED, WARMUP_REQUESTS, LevelRun
from specroute.loadgen.progress import Progress
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.sweep import SCHEMA, Sweep, SweepPlan


class _LevelLoop(ClosedLoop):
    """The live closed loop's rules for one level (see the module's docstring)."""

    def __init__(
        self,
        config: EmulatorConfig,
        level: int,
        repeat: int,
        requests: int,
        input_len: int,
        output_len: int,
    ) -> None:
        super().__init__(config, level, input_len, output_len)
        self.level, self.repeat, self.requests = level, repeat, requests
        self.records: dict[str, RequestRecord] = {}
        self.finished_by: dict[int, int] = {}  # requests each client finished before t0
        self.pending: set[str] = set()  # measured requests not yet ended
        self.measured_started = 0
        self.t0: float | None = None
        self.t1: float | None = None

    def prompt(self, rid: str) -> str:
        return f"{self.server.config.seed}|{self.level}|{self.repeat}|{rid}"

    def sending(self, rid: str) -> None:
        measured = self.t0 is not None and self.measured_started < self.requests
        if measured:
            self.measured_started += 1
            self.pending.add(rid)
        self.records[rid] = RequestRecord(
            self.server.config.mode,
            self.level,
            self.repeat,
            self.now,
            prompt_tokens=self.input_len,
            measured=measured,
        )

    def first_token(self, rid: str) -> bool:
        record = self.records[rid]
        if record.first_token is not None:
            return False
        record.first_token = self.now
        return True

    def finished(self, rid: str, tokens: int) -> None:
        record = self.records[rid]
        record.end, record.output_tokens = self.now, tokens
        if self.t0 is None:
            client = self.client_of[rid]
            self.finished_by[client] = self.finished_by.get(client, 0) + 1
            if sum(1 for n in self.finished_by.values() if n >= WARMUP_REQUESTS) == self.level:
                self.t0 = self.now
        self.pending.discard(rid)
        if self.t0 is not None and self.measured_started >= self.requests and not self.pending:
            self.t1 = self.now

    def over(self) -> bool:
        return self.t1 is not None

    def level_run(self) -> LevelRun:
        """The run, once over; times are virtual seconds from 0."""
        end = self.now if self.t1 is None else self.t1
        for record in self.records.values():
            if record.end is None:
                record.error = CANCELLED
        t0 = end if self.t0 is None else self.t0
        mode = self.server.config.mode
        records = list(self.records.values())
        return LevelRun(mode, self.level, self.repeat, t0, end, records, self.accept_length)


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:4], "big")


class VirtualSweep(Sweep):
    """``Sweep`` whose runs are closed loops (``_LevelLoop``) of two emulator settings:
    backend time is virtual (modelled) seconds."""

    def __init__(
        self,
        plan: SweepPlan,
        out: Path,
        config: EmulatorConfig,
        *,
        input_len: int,
        output_len: int,
        seed: int = 0,
        progress: Progress | None = None,
    ) -> None:
        super().__init__(plan, out, progress)
        self.config, self.seed = config, seed
        self.input_len, self.output_len = input_len, output_len

    async def __aenter__(self) -> Sweep:
        self.out.mkdir(parents=True, exist_ok=True)
        for name in ("levels.jsonl", "requests.jsonl"):
            (self.out / name).write_text("")
        info: dict[str, Any] = {
            backend: {"url": "virtual", "server_info": self._server_info(backend)}
            for backend in ("spec", "base")
        }
        self.meta = {
            "schema": SCHEMA,
            "model": self.config.model_path,
            **info,
            "fairness_warnings": [],
            "virtual_time": True,
            "dataset": {"kind": "synthetic", "input_len": self.input_len},
            "settings": {
                "repeats": self.plan.repeats,
                "requests": self.plan.requests,
                "ignore_eos": True,
                "output_len": self.output_len,
            },
        }
        self._write_meta()
        return self

    def _server_info(self, backend: str) -> dict[str, Any]:
        """What the live sweep reads of an emulated server, the running cap as it resolves
        it (``loadgen.fairness``) from the one the engine chose."""
        config = replace(self.config, mode="spec" if backend == "spec" else "base")
        emulator = {"hardware": config.hardware.name, "noise": config.noise.describe()}
        cap: dict[str, Any] = {"max_running_requests": config.effective_max_running}
        if config.resolved_max_running is None:
            cap["max_running_requests_effective"] = True
        return config.server_args() | cap | {"emulator": emulator}

    async def run_one(self, backend: str, level: int, repeat: int) -> tuple[LevelRun, float]:
        seed = _seed(self.seed, level, repeat)
        config = replace(self.config, mode="spec" if backend == "spec" else "base", seed=seed)
        requests = self.plan.requests_at(level) or max(16, 2 * level)
        loop = _LevelLoop(config, level, repeat, requests, self.input_len, self.output_len)
        loop.run()
        run = loop.level_run()
        sizes = [p.text_bytes for p in self.plan.dataset.prompts]
        for i, record in enumerate(run.records):
            record.prompt_bytes = sizes[i % len(sizes)]
        return run, run.t1 if run.records else 0.0

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.meta |= {
            "levels": sorted({r.level for r in self.runs}),
            "backend_seconds": self.backend_seconds,
            "complete": kind is None,
        }
        self._write_meta()
