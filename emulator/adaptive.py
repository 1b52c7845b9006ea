"""SGLang 0.5.23's adaptive speculation (``--speculative-adaptive``): the draft depth
(``speculative_num_steps``) chosen per decode batch, from a schedule of slots by batch size,
each moving among its candidate depths by a running average of the drafts each verify
accepted.

What SGLang does, as its ``adaptive_spec_params.py`` and ``eagle_worker_v2.py`` do it:

- The schedule (``--speculative-adaptive-config``, a JSON object, else the default below)
  maps batch sizes, as decimal strings, to a slot: its ``candidate_steps`` (non-negative
  integers) and optionally ``ema_alpha`` (0.2), ``update_interval`` (5), ``warmup_batches``
  (10), ``down_hysteresis`` (-0.25), ``up_hysteresis`` (0) and ``ceiling_coeff`` (0). A key
  that is not a number sets that field for every slot; a slot's own value wins.
- A decode batch of N requests is padded up to the next captured CUDA-graph batch size (N
  itself past the largest), then served by the slot of the largest key at or below it (the
  smallest slot below them all).
- A slot starts at the server's ``speculative_num_steps`` if that is a candidate, else at
  its middle candidate, its average at that depth less one. After each verify it folds in
  the mean drafts accepted per request (none at depth 0), counts the batch, and after
  ``warmup_batches``, every ``update_interval`` batches, moves: from depth 0 up to the next
  candidate (a probe); else down past every lower candidate whose threshold (0.5 for depth
  0, else that depth less 0.5, plus ``down_hysteresis``) the average is at or below, or, if
  it did not move down, up past every candidate whose threshold (that depth less 0.5, plus
  ``up_hysteresis``) it is above; with ``ceiling_coeff`` the new depth is capped at the
  average times it (rounded up, at least 1) when it is not a rise.
- At depth 0 a step still verifies through the one-token verify and runs the draft's
  extend, unless ``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND`` is set: then the extend is
  skipped, and a request that skipped one drafts from a stale state at its next positive
  depth (its first verify there accepts nothing: SGLang's "cold recovery")."""

from __future__ import annotations

import bisect
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SKIP_ZERO_STEP_DRAFT_EXTEND = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"

DEFAULT_SCHEDULE: dict[str, dict[str, Any]] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "up_hysteresis": 0.0, "down_hysteresis": -0.25},
    "8": {"candidate_steps": [0, 1, 3], "up_hysteresis": 0.0, "down_hysteresis": 0.0},
    "32": {"candidate_steps": [0, 1], "up_hysteresis": 0.0, "down_hysteresis": 0.0},
    "64": {"candidate_steps": [0], "up_hysteresis": 0.0, "down_hysteresis": 0.0},
}


class ScheduleError(ValueError):
    """A schedule SGLang would refuse at start, with its reason."""


def read_schedule(path: str | None) -> dict[str, Any]:
    """The schedule in the file at ``path`` (the default one for None), checked."""
    if path is None:
        return DEFAULT_SCHEDULE
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ScheduleError(f"--speculative-adaptive-config {path}: {exc}") from None
    slots(data)
    return dict(data)


def slots(schedule: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """Each slot by its batch size, with the schedule's common fields under its own, as
    SGLang reads them; a schedule SGLang refuses raises ``ScheduleError``."""
    if not isinstance(schedule, Mapping):
        raise ScheduleError("the adaptive schedule is a JSON object of batch sizes")
    common = {k: v for k, v in schedule.items() if not k.isdigit()}
    found: dict[int, dict[str, Any]] = {}
    for key, entry in schedule.items():
        if not key.isdigit():
            continue
        steps = entry.get("candidate_steps") if isinstance(entry, Mapping) else None
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)
        ):
            raise ScheduleError(
                f"batch size {key}: candidate_steps must be a list of non-negative integers, "
                f"got {steps!r}"
            )
        found[int(key)] = {**common, **entry}
    if not found:
        raise ScheduleError(
            'the adaptive schedule names no batch size (a key such as "1"); got keys '
            f"{sorted(schedule)}"
        )
    return found


def candidate_depths(schedule: Mapping[str, Any]) -> list[int]:
    """Every depth any slot may take (SGLang builds a runtime state for each)."""
    return sorted({s for entry in slots(schedule).values() for s in entry["candidate_steps"]})


def spec_graph_batch_sizes(max_bs: int) -> list[int]:
    """The decode batch sizes a speculative SGLang server captures as CUDA graphs up to
    ``max_bs`` (finer at small sizes than a plain server's), ``max_bs`` among them."""
    sizes = [
        *range(1, 9),
        *range(10, 33, 2),
        *range(40, 65, 4),
        *range(72, 257, 8),
        *range(272, max_bs + 1, 16),
    ]
    kept = [s for s in sizes if s <= max_bs]
    return kept if max_bs in kept else [*kept, max_bs]


@dataclass
class _Slot:
    """One batch size's depth and the average that moves it."""

    candidates: list[int]
    ema_alpha: float
    update_interval: int
    warmup_batches: int
    down_hysteresis: float
    up_hysteresis: float
    ceiling_coeff: float
    depth: int
    average: float  # drafts accepted per request per verify, smoothed
    batches: int = 0

    @classmethod
    def of(cls, entry: Mapping[str, Any], initial: int) -> _Slot:
        candidates = sorted(set(entry["candidate_steps"]))
        depth = initial if initial in candidates else candidates[len(candidates) // 2]
        return cls(
            candidates=candidates,
            ema_alpha=float(entry.get("ema_alpha", 0.2)),
            update_interval=int(entry.get("update_interval", 5)),
            warmup_batches=int(entry.get("warmup_batches", 10)),
            down_hysteresis=float(entry.get("down_hysteresis", -0.25)),
            up_hysteresis=float(entry.get("up_hysteresis", 0.0)),
            ceiling_coeff=float(entry.get("ceiling_coeff", 0)),
            depth=depth,
            average=float(depth - 1),
        )

    def verified(self, accepted: list[int]) -> None:
        """One verify's drafts accepted per request: folded in, and the depth moved when
        due."""
        if not accepted:
            return
        if self.depth > 0:
            mean = sum(accepted) / len(accepted)
            self.average += self.ema_alpha * (mean - self.average)
        self.batches += 1
        since = self.batches - self.warmup_batches
        if since > 0 and since % self.update_interval == 0:
            self.depth = self._next_depth()

    def _next_depth(self) -> int:
        at = self.candidates.index(self.depth)
        if self.depth == 0:  # a probe: the next depth up, from its neutral average if unseen
            probe = self.candidates[min(at + 1, len(self.candidates) - 1)]
            if probe > 0 and self.average < 0:
                self.average = float(probe - 1)
            return probe
        start = at
        while at > 0:
            lower = self.candidates[at - 1]
            threshold = (0.5 if lower == 0 else lower - 0.5) + self.down_hysteresis
            if self.average > threshold:
                break
            at -= 1
        if at == start:
            while at < len(self.candidates) - 1:
                if self.average <= self.candidates[at] - 0.5 + self.up_hysteresis:
                    break
                at += 1
        target = self.candidates[at]
        if self.ceiling_coeff > 0 and target <= self.depth:
            ceiling = max(1, math.ceil(self.average * self.ceiling_coeff))
            while at > 0 and self.candidates[at] > ceiling:
                at -= 1
            target = self.candidates[at]
        return target


class AdaptiveDepth:
    """The depth each decode batch is drafted to, and what each verify teaches it."""

    def __init__(
        self, initial: int, schedule: Mapping[str, Any], graph_sizes: list[int] | None
    ) -> None:
        found = slots(schedule)
        self._sizes = sorted(found)
        self._slots = {size: _Slot.of(entry, initial) for size, entry in found.items()}
        self._graphs = sorted(graph_sizes) if graph_sizes else None
        self.candidates = sorted({d for slot in self._slots.values() for d in slot.candidates})

    def depth_for(self, batch: int) -> int:
        return self._slot(batch).depth

    def verified(self, accepted: list[int], batch: int) -> None:
        self._slot(batch).verified(accepted)

    def _slot(self, batch: int) -> _Slot:
        padded = batch
        if self._graphs is not None:
            at = bisect.bisect_left(self._graphs, batch)
            padded = self._graphs[at] if at < len(self._graphs) else batch
        at = bisect.bisect_right(self._sizes, padded) - 1
        return self._slots[self._sizes[max(0, at)]]
