"""A sweep folder read back: per backend and level, the requests measured in valid runs."""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specroute.loadgen.record import RequestRecord


class SweepError(ValueError):
    """A sweep folder that cannot be analysed, with the reason."""


@dataclass
class Cell:
    """One backend at one level, pooled over repeats."""

    records: list[RequestRecord] = field(default_factory=list)
    runs: int = 0
    invalid_runs: int = 0
    failures: int = 0
    seconds: float = 0.0  # backend time the runs took
    accept_lengths: list[float] = field(default_factory=list)


@dataclass
class SweepData:
    path: Path
    meta: dict[str, Any]
    cells: dict[tuple[str, int], Cell]

    @property
    def levels(self) -> list[int]:
        both = [lvl for (b, lvl), c in self.cells.items() if b == "spec" and c.records]
        return sorted(lvl for lvl in both if self.cells.get(("base", lvl), Cell()).records)


def _lines(path: Path) -> list[dict[str, Any]]:
    try:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        raise SweepError(f"cannot read {path}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise SweepError(f"{path}: not JSON lines: {exc.msg}") from None


def load_sweep(path: Path) -> SweepData:
    try:
        meta = json.loads((path / "meta.json").read_text())
    except OSError:
        raise SweepError(f"{path} is not a sweep folder (no meta.json)") from None
    valid = set()
    cells: dict[tuple[str, int], Cell] = defaultdict(Cell)
    for run in _lines(path / "levels.jsonl"):
        key = (run["backend"], run["level"], run["repeat"])
        cell = cells[(run["backend"], run["level"])]
        cell.runs += 1
        cell.failures += run["failures"]
        cell.seconds += run.get("seconds", 0.0)
        if run["valid"]:
            valid.add(key)
            if run.get("accept_length") is not None:
                cell.accept_lengths.append(run["accept_length"])
        else:
            cell.invalid_runs += 1
    for data in _lines(path / "requests.jsonl"):
        record = RequestRecord.from_json(data)
        if record.measured and record.ok and (record.backend, record.level, record.repeat) in valid:
            cells[(record.backend, record.level)].records.append(record)
    if not cells:
        raise SweepError(f"{path}: no level was measured")
    return SweepData(path, meta, dict(cells))
