"""``/start_profile`` and ``/stop_profile``, as SGLang 0.5.23 answers them, with the
emulator's steps for a trace: where SGLang writes the torch profiler's trace, the emulator
writes each step it modelled between the two (its kind, batch and tokens) in the same
Chrome trace format, under SGLang's file name, so that a profile asked of every server
leaves one file per server to open in Perfetto.

One profile at a time: a second start, or a stop with none running, fails as SGLang's do
(a 500, its message only in the log). ``num_steps`` ends the profile by itself after that
many steps; ``output_dir`` defaults to ``SGLANG_TORCH_PROFILER_DIR``, else ``/tmp``.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specroute.emulator.engine import Step
from specroute.emulator.errors import BadRequest

STARTED = "Start profiling.\n"
STOPPED = "Stop profiling. This will take some time.\n"
_FIELDS: dict[str, type] = {  # the fields of SGLang's ProfileReq the emulator reads
    "output_dir": str,
    "num_steps": int,
    "profile_id": str,
    "profile_prefix": str,
}
_log = logging.getLogger("specroute.emulator")


@dataclass
class _Profile:
    output_dir: Path
    profile_id: str
    prefix: str
    steps_left: int | None
    events: list[dict[str, Any]] = field(default_factory=list)


class StepTrace:
    def __init__(self) -> None:
        self._profile: _Profile | None = None

    def start(self, asked: object) -> bool:
        """Whether a profile started (False: one runs already); BadRequest for a body that
        is not SGLang's ``ProfileReq``."""
        given = _read(asked)
        if self._profile is not None:
            _log.warning("Profiling is already in progress. Call /stop_profile first.")
            return False
        steps = given.get("num_steps")
        if steps is not None and steps <= 0:
            raise BadRequest("num_steps must be positive")
        out = given.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        self._profile = _Profile(
            Path(out).expanduser(),
            given.get("profile_id") or str(time.time()),
            given.get("profile_prefix") or "",
            steps,
        )
        return True

    def stop(self) -> bool:
        """Whether a profile was running, now written."""
        if self._profile is None:
            _log.warning("Profiling is not in progress. Call /start_profile first.")
            return False
        self._write(self._profile)
        self._profile = None
        return True

    def record(self, step: Step, start: float, seconds: float) -> None:
        """One step modelled, ``seconds`` long from ``start`` (the loop's clock)."""
        profile = self._profile
        if profile is None:
            return
        profile.events.append(
            {
                "name": step.kind,
                "ph": "X",
                "ts": round(start * 1e6, 3),
                "dur": round(seconds * 1e6, 3),
                "pid": 0,
                "tid": 0,
                "args": {"batch": step.batch, "tokens": sum(len(e.ids) for e in step.emitted)},
            }
        )
        if profile.steps_left is not None:
            profile.steps_left -= 1
            if profile.steps_left == 0:
                self.stop()

    def _write(self, profile: _Profile) -> None:
        prefix = f"{profile.prefix}-" if profile.prefix else ""
        path = profile.output_dir / f"{prefix}{profile.profile_id}-TP-0.trace.json.gz"
        profile.output_dir.mkdir(parents=True, exist_ok=True)
        trace = {"traceEvents": profile.events, "displayTimeUnit": "ms"}
        path.write_bytes(gzip.compress(json.dumps(trace).encode()))
        _log.info("Profiling done. Traces are saved to: %s", profile.output_dir)


def _read(asked: object) -> dict[str, Any]:
    """The fields read from a ``ProfileReq``, each of its type (SGLang's 400 otherwise)."""
    if asked is None:
        return {}
    if not isinstance(asked, dict):
        raise BadRequest("The profile request must be a JSON object.")
    given = {}
    for name, kind in _FIELDS.items():
        value = asked.get(name)
        if value is None:
            continue
        if not isinstance(value, kind) or isinstance(value, bool):
            raise BadRequest(f"{name} must be a {kind.__name__}, not {value!r}")
        given[name] = value
    return given
