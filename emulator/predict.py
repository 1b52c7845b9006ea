"""The model's ground truth: steady-state speed of both modes at each concurrency.

Runs the same engine the server runs, in virtual time, under a closed loop of
``concurrency`` clients that each send a new request as soon as the last one ends (as
``specroute bench sweep`` does), and measures what the benchmark measures: per-request
decode speed as 1 / median TPOT, and total output tok/s, over a steady-state window.
Several prompt lengths give one prediction each: the crossover per context bucket, whose
context is the mean KV tokens per request while it decodes (input + output / 2).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from specroute.crossing import Band, Crossing, bands, crossing, crossings
from specroute.emulator.config import EmulatorConfig
from specroute.emulator.virtual import ClosedLoop

_MIN_REQUESTS = 400


@dataclass(frozen=True)
class Speed:
    per_request: float  # tok/s of one stream while decoding: 1 / median TPOT
    total: float  # output tok/s of the whole server
    accept_length: float | None


@dataclass(frozen=True)
class Level:
    concurrency: int
    base: Speed
    spec: Speed

    @property
    def speedup(self) -> float:
        return self.spec.per_request / self.base.per_request

    @property
    def total_speedup(self) -> float:
        return self.spec.total / self.base.total


@dataclass(frozen=True)
class Prediction:
    levels: tuple[Level, ...]
    crossover: float | None  # per-request decode speed: where speculation stops paying
    throughput_crossover: float | None  # the same for total throughput
    input_len: int
    output_len: int
    spec_max_running: int

    @property
    def context(self) -> float:
        """Mean KV tokens per request while it decodes: its prompt and half its answer."""
        return self.input_len + self.output_len / 2

    @property
    def per_request(self) -> list[tuple[float, float]]:
        return [(lv.concurrency, lv.speedup) for lv in self.levels]

    @property
    def total(self) -> list[tuple[float, float]]:
        return [(lv.concurrency, lv.total_speedup) for lv in self.levels]


class _Truth(ClosedLoop):
    """The closed loop of ``simulate``: ``total`` requests, each answer kept as (start,
    first token, end, tokens)."""

    def __init__(
        self,
        config: EmulatorConfig,
        concurrency: int,
        input_len: int,
        output_len: int,
        total: int,
    ) -> None:
        super().__init__(config, concurrency, input_len, output_len)
        self.total = total
        self.started: dict[str, float] = {}
        self.first: dict[str, float] = {}
        self.answers: list[tuple[float, float, float, int]] = []

    def prompt(self, rid: str) -> str:
        return f"request {rid}"

    def sending(self, rid: str) -> None:
        self.started[rid] = self.now

    def first_token(self, rid: str) -> bool:
        if rid in self.first:
            return False
        self.first[rid] = self.now
        return True

    def finished(self, rid: str, tokens: int) -> None:
        self.answers.append((self.started[rid], self.first[rid], self.now, tokens))

    def may_send(self, waiting: int) -> bool:
        return self.sent + waiting < self.total

    def done(self) -> bool:
        return len(self.answers) >= self.total


def simulate(
    config: EmulatorConfig, concurrency: int, input_len: int, output_len: int, rounds: int = 4
) -> Speed:
    """Closed loop in virtual time, as a client drives the live server (``ClosedLoop``).
    The first ``concurrency`` requests to end (the warm-up) and the last
    ``concurrency`` (the drain) are left out."""
    loop = _Truth(
        config, concurrency, input_len, output_len, max(_MIN_REQUESTS, (rounds + 3) * concurrency)
    )
    loop.run()
    done = loop.answers
    window = sorted(done, key=lambda d: d[2])[concurrency : len(done) - concurrency]
    if len(window) < 2:
        window = done
    tpots = [(end - tf) / (n - 1) for _, tf, end, n in window if n > 1]
    span = window[-1][2] - window[0][2]
    tokens = sum(n for *_, n in window[1:])
    return Speed(
        per_request=1.0 / statistics.median(tpots),
        total=tokens / span if span > 0 else 0.0,
        accept_length=loop.accept_length,
    )


def speedup_crossing(points: Sequence[tuple[float, float]]) -> Crossing:
    """The crossing finder on (concurrency, speculative over plain speed) pairs: the margin
    is the log of the ratio, as for any two curves (``log_margin``)."""
    return crossing([c for c, _ in points], [math.log(r) for _, r in points])


def paying_bands(points: Sequence[tuple[float, float]]) -> list[Band]:
    """Where speculation pays, from (concurrency, speculative over plain speed) pairs."""
    return bands([c for c, _ in points], [math.log(r) for _, r in points])


def _reading(points: Sequence[tuple[float, float]]) -> tuple[str, float | None, list[Band]]:
    """Where speculation pays over ``points``: "nowhere", "everywhere", "below" (one
    crossover, the number) or "bands" (the spans)."""
    found, paying = speedup_crossing(points), paying_bands(points)
    if not paying:
        return "nowhere", None, paying
    if paying == [(None, points[-1][0])]:
        return "everywhere", None, paying
    if len(paying) == 1 and found.at is not None:
        return "below", found.at, paying
    return "bands", None, paying


def verdict(points: Sequence[tuple[float, float]], what: str) -> str:
    """Where speculation pays, in words: below a crossover, in bands, everywhere or nowhere."""
    kind, at, paying = _reading(points)
    lo, hi = points[0][0], points[-1][0]
    if kind == "nowhere":
        return f"speculation pays for {what} at no level measured: crossover below {lo:g}"
    if kind == "everywhere":
        return f"speculation pays for {what} at every level measured: crossover above {hi:g}"
    if kind == "below":
        return f"speculation stops paying for {what} at concurrency {at:.1f}"
    spans = ", ".join(
        f"{'from the lowest load' if a is None else f'from {a:.1f}'} to "
        + (f"{b:g} (the last level measured)" if b == hi else f"{b:.1f}")
        for a, b in paying
    )
    return f"speculation pays for {what} in {len(paying)} band(s): {spans}"


def crossover_cell(points: Sequence[tuple[float, float]]) -> str:
    """``verdict`` in a table cell: "87.3", "above 256", "below 1" or the bands."""
    kind, at, paying = _reading(points)
    if kind == "nowhere":
        return f"below {points[0][0]:g}"
    if kind == "everywhere":
        return f"above {points[-1][0]:g}"
    if kind == "below":
        return f"{at:.1f}"
    return " + ".join(f"{'1' if a is None else f'{a:.1f}'}-{b:.1f}" for a, b in paying)


def render(prediction: Prediction, title: str) -> str:
    rows = [
        title,
        f"closed loop, {prediction.input_len} input and {prediction.output_len} output tokens"
        " per request; tok/s per request = 1 / median TPOT",
        f"{'concurrency':>11} {'base/req':>9} {'spec/req':>9} {'speedup':>8}"
        f" {'base total':>11} {'spec total':>11} {'speedup':>8} {'accept':>7}",
    ]
    for lv in prediction.levels:
        accept = lv.spec.accept_length
        rows.append(
            f"{lv.concurrency:>11} {lv.base.per_request:>9.1f} {lv.spec.per_request:>9.1f}"
            f" {lv.speedup:>7.2f}x {lv.base.total:>11.1f} {lv.spec.total:>11.1f}"
            f" {lv.total_speedup:>7.2f}x {accept if accept is not None else float('nan'):>7.2f}"
        )
    rows.append(verdict(prediction.per_request, "per-request decode speed"))
    rows.append(verdict(prediction.total, "total throughput"))
    if prediction.spec_max_running < prediction.levels[-1].concurrency:
        rows.append(
            f"note: the speculative server runs at most {prediction.spec_max_running} requests"
            " at once (SGLang's default for EAGLE unless --max-running-requests is set); above"
            " that it queues, so its per-request speed flatters it while its total throughput"
            " stalls. Raise the cap on both servers for a fair comparison."
        )
    return "\n".join(rows)


def render_contexts(predictions: Sequence[Prediction], title: str) -> str:
    """Each prompt length's table, then the crossover by context: where speculation stops
    paying (or the bands where it pays) at each, per request and in total."""
    tables = [render(p, f"{title}, {p.input_len} input tokens") for p in predictions]
    rows = [
        "crossover by context (mean KV tokens per request while decoding: input + output/2)",
        f"{'context':>9} {'input':>7}  {'per-request':>16}  {'throughput':>16}",
    ]
    rows += [
        f"{p.context:>9g} {p.input_len:>7}  {crossover_cell(p.per_request):>16}"
        f"  {crossover_cell(p.total):>16}"
        for p in predictions
    ]
    return "\n\n".join([*tables, "\n".join(rows)])


def as_json(prediction: Prediction) -> dict[str, object]:
    def speed(s: Speed) -> dict[str, object]:
        return {
            "per_request_tok_s": s.per_request,
            "total_tok_s": s.total,
            "accept_length": s.accept_length,
        }

    return {
        "input_len": prediction.input_len,
        "output_len": prediction.output_len,
        "crossover": prediction.crossover,
        "throughput_crossover": prediction.throughput_crossover,
        "levels": [
            {
                "concurrency": lv.concurrency,
                "base": speed(lv.base),
                "spec": speed(lv.spec),
                "speedup": lv.speedup,
                "total_speedup": lv.total_speedup,
            }
            for lv in prediction.levels
        ],
    }


def _crossover(points: Sequence[tuple[float, float]]) -> dict[str, object]:
    """The profile's crossover object for predicted points: the interval is the point
    itself (a model has no sampling error); every crossing and the bands where speculation
    pays are written, as calibration writes them."""
    found = speedup_crossing(points)
    if found.at is not None:
        crossover: dict[str, object] = {"value": found.at, "ci": [found.at] * 2}
    else:
        crossover = {"value": None, "ci": None, "bound": found.bound, "limit": found.limit}
    turns = crossings([c for c, _ in points], [math.log(r) for _, r in points])
    return crossover | {
        "crossings": [{"at": t.at, "direction": t.direction, "ci": [t.at] * 2} for t in turns],
        "bands": [list(b) for b in paying_bands(points)],
    }


def as_profile(prediction: Prediction, config: EmulatorConfig) -> dict[str, object]:
    """The prediction as a ``specroute.profile/v1`` document, marked as predicted: routing
    can be rehearsed (offline or against emulated servers) before anything is measured.
    A mixture-of-experts model's band routes as measured. Curves and crossover are
    written unrounded, so a policy reading the curves finds the crossover written."""
    levels = prediction.levels
    accepts = [a for lv in levels if (a := lv.spec.accept_length) is not None]

    def cell(s: Speed) -> dict[str, object]:
        return {"tpot_ms": {"median": 1000.0 / s.per_request}, "output_tps": {"median": s.total}}

    return {
        "schema": "specroute.profile/v1",
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "crossover": _crossover(prediction.per_request) | {"metric": "tpot"},
        "levels": [
            {"concurrency": lv.concurrency, "spec": cell(lv.spec), "base": cell(lv.base)}
            for lv in levels
        ],
        "acceptance": {
            "mean_accept_length": round(statistics.mean(accepts), 3) if accepts else None,
            "source": "predicted",
        },
        "servers": {
            "spec": {"max_running_requests": prediction.spec_max_running},
            "base": {"max_running_requests": replace(config, mode="base").effective_max_running},
        },
        "workload": {"input_len": prediction.input_len, "output_len": prediction.output_len},
        "measurement": {"method": "predicted", "hardware": config.hardware.name},
    }


def as_context_profile(
    predictions: Sequence[Prediction], config: EmulatorConfig, tokens_per_byte: float
) -> dict[str, object]:
    """Predictions at several prompt lengths as a ``specroute.profile/v2`` document: the
    first (shortest) one's ``v1`` document, and the crossover and curves per context
    bucket."""
    buckets = [
        {
            "context": p.context,
            "input_len": p.input_len,
            "output_len": p.output_len,
            "crossover": _crossover(p.per_request) | {"metric": "tpot"},
            "throughput_crossover": _crossover(p.total) | {"metric": "output_tps"},
            "levels": [lv.concurrency for lv in p.levels],
            "tpot_ms": {
                "spec": [1000.0 / lv.spec.per_request for lv in p.levels],
                "base": [1000.0 / lv.base.per_request for lv in p.levels],
            },
        }
        for p in predictions
    ]
    return as_profile(predictions[0], config) | {
        "schema": "specroute.profile/v2",
        "context": {"tokens_per_byte": tokens_per_byte, "buckets": buckets},
    }


def predict(
    config: EmulatorConfig,
    concurrencies: list[int],
    input_len: int = 512,
    output_len: int = 256,
    base: EmulatorConfig | None = None,
) -> Prediction:
    """Both servers at each concurrency; ``base``: the plain server's settings where they
    differ from ``config``'s (its memory, sharing GPUs with the speculative one)."""
    spec_config = replace(config, mode="spec")
    base_config = replace(base or config, mode="base")
    levels = tuple(
        Level(
            c,
            simulate(base_config, c, input_len, output_len),
            simulate(spec_config, c, input_len, output_len),
        )
        for c in sorted(set(concurrencies))
    )
    return Prediction(
        levels=levels,
        crossover=speedup_crossing([(lv.concurrency, lv.speedup) for lv in levels]).at,
        throughput_crossover=speedup_crossing(
            [(lv.concurrency, lv.total_speedup) for lv in levels]
        ).at,
        input_len=input_len,
        output_len=output_len,
        spec_max_running=spec_config.effective_max_running,
    )
