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
from specroute.emulator.engine import Sequence
from specroute.loadgen.closed_loop import CANCELLED, WARMUP_REQUESTS, LevelRun
from specroute.loadgen.progress import Progress
from specroute.loadgen.record import RequestRecord
from specroute.loadgen.sweep import SCHEMA, Sweep, SweepPlan


def run_virtual(
    config: EmulatorConfig,
    level: int,
    repeat: int,
    requests: int,
    input_len: int,
    output_len: int,
) -> LevelRun:
    """One closed-loop run of ``config``'s engine; times are virtual seconds from 0."""
    engine = config.engine()
    backend = config.mode
    now, sent, clients = 0.0, 0, 0
    records: dict[str, RequestRecord] = {}
    client_of: dict[str, int] = {}
    finished: dict[int, int] = {}
    pending: set[str] = set()
    t0: float | None = None
    t1: float | None = None
    measured_started = verifies = spec_tokens = 0

    def send(client: int) -> None:
        nonlocal sent, measured_started
        rid = str(sent)
        sent += 1
        measured = t0 is not None and measured_started < requests
        if measured:
            measured_started += 1
            pending.add(rid)
        records[rid] = RequestRecord(
            backend, level, repeat, now, prompt_tokens=input_len, measured=measured
        )
        client_of[rid] = client
        prompt = f"{config.seed}|{level}|{repeat}|{rid}"
        engine.submit(Sequence(rid, prompt, input_len, output_len, ignore_eos=True))

    send(0)
    clients = 1
    arrivals: list[int] = []
    while t1 is None:
        step = engine.step()
        for client in arrivals:  # answers arrive while the next step runs
            send(client)
        arrivals = []
        if step is None:
            if engine.waiting:
                continue
            break
        now += step.duration
        for emission in step.emitted:
            rid = emission.seq.rid
            record = records[rid]
            if emission.ids and record.first_token is None:
                record.first_token = now
                if clients < level:
                    arrivals.append(clients)
                    clients += 1
            if step.kind == "decode" and engine.speculative:
                verifies += 1
                spec_tokens += len(emission.ids)
            if emission.finish is None:
                continue
            record.end, record.output_tokens = now, len(emission.seq.output_ids)
            client = client_of[rid]
            if t0 is None:
                finished[client] = finished.get(client, 0) + 1
                if sum(1 for n in finished.values() if n >= WARMUP_REQUESTS) == level:
                    t0 = now
            pending.discard(rid)
            if t0 is not None and measured_started >= requests and not pending:
                t1 = now
                break
            arrivals.append(client)
    end = now if t1 is None else t1
    for record in records.values():
        if record.end is None:
            record.error = CANCELLED
    accept = spec_tokens / verifies if verifies else None
    return LevelRun(
        backend, level, repeat, end if t0 is None else t0, end, list(records.values()), accept
    )


def _seed(*parts: object) -> int:
    return int.from_bytes(hashlib.sha256("|".join(map(str, parts)).encode()).digest()[:4], "big")


class VirtualSweep(Sweep):
    """``Sweep`` whose runs are ``run_virtual`` of two emulator settings: backend time is
    virtual (modelled) seconds."""

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
            backend: {
                "url": "virtual",
                "server_info": replace(self.config, mode=backend).server_args()
                | {
                    "emulator": {
                        "hardware": self.config.hardware.name,
                        "noise": self.config.noise.describe(),
                    }
                },
            }
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

    async def run_one(self, backend: str, level: int, repeat: int) -> tuple[LevelRun, float]:
        seed = _seed(self.seed, level, repeat)
        config = replace(self.config, mode="spec" if backend == "spec" else "base", seed=seed)
        requests = self.plan.requests_at(level) or max(16, 2 * level)
        run = run_virtual(config, level, repeat, requests, self.input_len, self.output_len)
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
