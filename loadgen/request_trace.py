"""A trace of requests as production traffic sent them: each request's arrival time, its
prompt's tokens and the tokens it generated, replayed open loop (a request arrives when the
trace says, whatever the server is doing).

The shipped one is the conversation half of the Azure LLM inference trace 2023 (CC-BY 4.0;
``loadgen/traces/README.md`` has its attribution). A replay takes a window of it and scales
its rate: arrival times divided by the factor, so the same requests come that much faster
and the burstiness stays the trace's own. A shaped trace (``ramp``, ``day``) sends a window's
requests, in their order, at a rate that changes by phase."""

from __future__ import annotations

import csv
import gzip
import io
import itertools
import statistics
from dataclasses import dataclass, replace
from datetime import datetime
from importlib import resources
from pathlib import Path

from specroute.loadgen.trace import Phase, Trace, diurnal

AZURE_CONVERSATIONS = "azure-llm-2023-conv.csv.gz"


class RequestTraceError(ValueError):
    """A request trace that cannot be read, with the reason."""


@dataclass(frozen=True)
class TracedRequest:
    at: float  # seconds from the trace's start
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True)
class RequestTrace:
    name: str
    requests: tuple[TracedRequest, ...]  # by arrival
    source: str  # where it came from, and its window and scale
    busiest: float | None = None  # a shaped trace's requests a second in its busiest phase

    @property
    def seconds(self) -> float:
        return self.requests[-1].at if self.requests else 0.0

    @property
    def rate(self) -> float:
        """Requests a second, on average."""
        return len(self.requests) / self.seconds if self.seconds > 0 else 0.0

    @property
    def peak_rate(self) -> float:
        """The rate a load is stated at: the busiest phase's for a shaped trace, else the
        mean."""
        return self.rate if self.busiest is None else self.busiest

    def describe(self) -> dict[str, object]:
        prompts = [r.prompt_tokens for r in self.requests]
        outputs = [r.output_tokens for r in self.requests]
        return {
            "name": self.name,
            "source": self.source,
            "requests": len(self.requests),
            "seconds": round(self.seconds, 3),
            "rate": round(self.rate, 4),
            "peak_rate": round(self.peak_rate, 4),
            "prompt_tokens_p50": statistics.median(prompts) if prompts else None,
            "output_tokens_p50": statistics.median(outputs) if outputs else None,
        }

    def window(self, start: float, seconds: float) -> RequestTrace:
        """The requests that arrived in ``[start, start + seconds)``, times from 0."""
        kept = tuple(
            TracedRequest(r.at - start, r.prompt_tokens, r.output_tokens)
            for r in self.requests
            if start <= r.at < start + seconds
        )
        if not kept:
            raise RequestTraceError(
                f"{self.name}: no request in [{start:g}, {start + seconds:g}) s"
            )
        return RequestTrace(self.name, kept, f"{self.source}, window {start:g}+{seconds:g} s")

    def scaled(self, factor: float) -> RequestTrace:
        """The same requests arriving ``factor`` times as fast."""
        if factor <= 0:
            raise RequestTraceError(f"a rate factor must be positive, got {factor}")
        faster = tuple(
            TracedRequest(r.at / factor, r.prompt_tokens, r.output_tokens) for r in self.requests
        )
        busiest = None if self.busiest is None else self.busiest * factor
        return RequestTrace(self.name, faster, f"{self.source}, rate x{factor:g}", busiest)


SHAPES: dict[str, tuple[float, ...]] = {
    # the rate doubling from a sixteenth of the peak to the peak and back
    "ramp": (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1.0, 1 / 2, 1 / 4, 1 / 8, 1 / 16),
    # a day's hours as ``trace.diurnal`` has them, from midnight
    "day": tuple(diurnal(hour) for hour in range(24)),
}


def shaped(shape: str, lengths: RequestTrace, seed: int = 0) -> RequestTrace:
    """``lengths``' requests, in their order (again from the first if more are needed),
    arriving as a ``ramp`` or a ``day``: Poisson arrivals at a rate per phase, the busiest
    at ``lengths``' mean rate, the phases together as long as ``lengths``."""
    relative = SHAPES[shape]
    seconds = lengths.seconds / len(relative)
    phases = Trace(shape, tuple(Phase(seconds, rate=lengths.rate * r) for r in relative))
    sizes = itertools.cycle(lengths.requests)
    requests = tuple(replace(next(sizes), at=at) for at in phases.arrivals(seed))
    source = f"{lengths.source}, its lengths arriving as a {shape} of {len(relative)} phases"
    return RequestTrace(f"{lengths.name}-{shape}", requests, source, lengths.rate)


def azure_conversations() -> RequestTrace:
    """The shipped copy of the Azure LLM inference trace 2023, conversation half."""
    data = resources.files("specroute.loadgen").joinpath("traces", AZURE_CONVERSATIONS)
    with data.open("rb") as raw:
        text = gzip.decompress(raw.read()).decode()
    return parse_azure(text, "azure-llm-2023-conv")


def load_azure(path: Path) -> RequestTrace:
    """An Azure LLM inference trace file (``TIMESTAMP,ContextTokens,GeneratedTokens``),
    plain or gzipped."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RequestTraceError(f"cannot read {path}: {exc}") from None
    text = gzip.decompress(raw).decode() if raw[:2] == b"\x1f\x8b" else raw.decode()
    return parse_azure(text, path.stem.removesuffix(".csv"))


def parse_azure(text: str, name: str) -> RequestTrace:
    rows = csv.DictReader(io.StringIO(text))
    requests = []
    start: datetime | None = None
    try:
        for line, row in enumerate(rows, start=2):
            at = datetime.fromisoformat(row["TIMESTAMP"][:26])  # microseconds at most
            start = at if start is None else start
            context, generated = int(row["ContextTokens"]), int(row["GeneratedTokens"])
            if context < 1 or generated < 0:
                raise RequestTraceError(f"{name}, line {line}: token counts out of range")
            requests.append(TracedRequest((at - start).total_seconds(), context, generated))
    except (KeyError, ValueError, TypeError) as exc:
        if isinstance(exc, RequestTraceError):
            raise
        raise RequestTraceError(f"{name}: not an Azure LLM inference trace ({exc})") from None
    if not requests:
        raise RequestTraceError(f"{name}: no requests")
    requests.sort(key=lambda r: r.at)
    return RequestTrace(name, tuple(requests), f"{name} ({len(requests)} requests)")
