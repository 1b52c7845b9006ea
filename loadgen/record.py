"""One request as a benchmark saw it, kept raw, and the metrics defined on it.

Times are seconds on one monotonic clock per sweep. Definitions (the crossover page of the
docs states them):
TTFT = first token - start; TPOT = (end - first token) / (output tokens - 1); ITL is per
token (a chunk carrying k tokens after a gap g counts k gaps of g / k); E2E = end - start;
decode tok/s = 1 / TPOT.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    backend: str  # "spec" or "base", or a policy's name in a comparison
    level: int
    repeat: int
    start: float
    first_token: float | None = None
    end: float | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list)  # (time, tokens)
    output_tokens: int | None = None  # from the server's usage
    prompt_tokens: int | None = None
    prompt_bytes: int | None = None  # UTF-8 bytes of the prompt's text, as sent
    error: str | None = None
    served_by: str | None = None  # the router's x-specroute-backend header, if any
    measured: bool = False  # begun inside the steady window (the rest keep the load up)

    @property
    def ok(self) -> bool:
        return self.error is None and self.end is not None and self.first_token is not None

    @property
    def tokens(self) -> int:
        return (
            self.output_tokens if self.output_tokens is not None else sum(n for _, n in self.chunks)
        )

    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.start

    def tpot(self) -> float | None:
        if not self.ok or self.tokens < 2:
            return None
        assert self.end is not None and self.first_token is not None
        return (self.end - self.first_token) / (self.tokens - 1)

    def e2e(self) -> float | None:
        return None if self.end is None else self.end - self.start

    def decode_tps(self) -> float | None:
        tpot = self.tpot()
        return None if tpot is None or tpot <= 0 else 1.0 / tpot

    def itl(self) -> list[float]:
        gaps = []
        for (t0, _), (t1, n) in zip(self.chunks, self.chunks[1:], strict=False):
            gaps += [(t1 - t0) / n] * n
        return gaps

    def as_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        data = dict(data)
        data["chunks"] = [(float(t), int(n)) for t, n in data.get("chunks", [])]
        return cls(**data)


def tokens_between(records: Iterable[RequestRecord], start: float, end: float) -> int:
    """Output tokens that arrived in ``[start, end]``, whichever request carried them."""
    return sum(n for r in records for t, n in r.chunks if start <= t <= end)


def mean_latency(records: Iterable[RequestRecord]) -> float:
    """The mean time of the requests that ended without an error; 0 where none did."""
    done = [r.end - r.start for r in records if r.end is not None and r.error is None]
    return sum(done) / len(done) if done else 0.0
