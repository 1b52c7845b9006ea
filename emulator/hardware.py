"""Hardware models: how long one engine step takes, read from interpolated step-time tables.

A model is a JSON file (schema ``specroute.hardware/v1``). Its tables give milliseconds
against a count: the target model's forward pass against the tokens in the pass (one
table per verify width, as SGLang's ``SGLANG_RECORD_STEP_TIME=1`` would record it), one
draft step against the batch size, the draft's extend pass and the target's prefill
against tokens. Every table was taken at ``context_len`` tokens of KV cache per request;
the attention term moves a step's time with the batch's real KV context: one slope
(``attention_ms_per_kv_token``), or an optional ``context`` section of step times measured
at several contexts, which also says how the attention kernels read the cache in a pass of
several query tokens per request (see ``ContextAttention``).
"""

from __future__ import annotations

import json
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, cast, get_args

from specroute.emulator.memory import Memory, parse_memory

SCHEMA = "specroute.hardware/v1"
_SHIPPED = "specroute.emulator.hardware_models"


class HardwareError(ValueError):
    """A hardware model file that cannot be used, with the reason."""


@dataclass(frozen=True)
class Curve:
    """Milliseconds against a count: linear between points, the end slopes beyond them."""

    x: tuple[float, ...]
    ms: tuple[float, ...]

    @classmethod
    def from_table(cls, table: Any, what: str) -> Curve:
        if not isinstance(table, dict) or len(table) < 2:
            raise HardwareError(f"{what}: expected an object of two or more count -> milliseconds")
        try:
            points = sorted((float(k), float(v)) for k, v in table.items())
        except (TypeError, ValueError) as exc:
            raise HardwareError(f"{what}: keys and values must be numbers ({exc})") from None
        if any(x <= 0 or ms <= 0 for x, ms in points):
            raise HardwareError(f"{what}: counts and milliseconds must be positive")
        return cls(tuple(x for x, _ in points), tuple(ms for _, ms in points))

    def __call__(self, n: float) -> float:
        x, ms = self.x, self.ms
        if n <= x[0]:
            return ms[0]
        i = min(bisect_right(x, n), len(x) - 1)
        x0, x1, y0, y1 = x[i - 1], x[i], ms[i - 1], ms[i]
        return y0 + (y1 - y0) * (n - x0) / (x1 - x0)


@dataclass(frozen=True)
class ContextGrid:
    """Step milliseconds measured at several KV contexts per request, each a curve over batch.

    Linear in the context between the measured ones and on the end slopes beyond them, both
    ways: attention reads bytes in proportion to the context, and the measured steps are
    linear in it, unlike a pass's token count, whose smallest measurement is a floor.
    """

    contexts: tuple[float, ...]
    curves: tuple[Curve, ...]

    @classmethod
    def from_table(cls, table: Any, what: str) -> ContextGrid:
        if not isinstance(table, dict) or len(table) < 2:
            raise HardwareError(f"{what}: expected two or more contexts -> a table by batch")
        try:
            rows = sorted((float(k), v) for k, v in table.items())
        except (TypeError, ValueError) as exc:
            raise HardwareError(f"{what}: contexts must be numbers ({exc})") from None
        if any(context <= 0 for context, _ in rows):
            raise HardwareError(f"{what}: contexts must be positive")
        curves = tuple(Curve.from_table(t, f"{what}[{context:g}]") for context, t in rows)
        return cls(tuple(context for context, _ in rows), curves)

    def __call__(self, context: float, batch: float) -> float:
        x = self.contexts
        i = min(max(bisect_right(x, context), 1), len(x) - 1)
        y0, y1 = self.curves[i - 1](batch), self.curves[i](batch)
        return y0 + (y1 - y0) * (context - x[i - 1]) / (x[i] - x[i - 1])

    def extra_ms(self, batch: int, kv_tokens: int, context_len: int) -> float:
        """At the batch's mean context per request, over the same batch at ``context_len``."""
        return self(kv_tokens / batch, batch) - self(context_len, batch)


Reads = Literal["shared", "per_token"]


@dataclass(frozen=True)
class ContextAttention:
    """Step times measured at several contexts, and how a pass of ``width`` query tokens per
    request reads the cache: ``shared``, once per step (decode kernels that fold the query
    tokens onto one read, as FlashInfer's do), or ``per_token``, once per query token (plain
    SDPA). The draft's attention follows the same kernels: its one-token step reads once,
    its extend over ``width`` tokens as the target's verify does.

    Shared passes move with the context as plain decode does (width 1). Per-token passes
    take the measured widths, linear in the width between them and in proportion to it
    beyond the widest: each query token is one more read.
    """

    reads: Reads
    target: dict[int, ContextGrid]  # by query tokens per request; 1 is plain decode
    draft: ContextGrid  # one draft step, one query token per request

    def target_extra_ms(self, batch: int, width: int, kv_tokens: int, context_len: int) -> float:
        return self._extra(self.target, batch, width, kv_tokens, context_len)

    def draft_extra_ms(self, batch: int, width: int, kv_tokens: int, context_len: int) -> float:
        return self._extra({1: self.draft}, batch, width, kv_tokens, context_len)

    def _extra(
        self, grids: dict[int, ContextGrid], batch: int, width: int, kv_tokens: int, base: int
    ) -> float:
        if self.reads == "shared":
            return grids[1].extra_ms(batch, kv_tokens, base)
        widest = max(grids)
        scale = width / widest if width > widest else 1.0
        return scale * sum(
            share * grids[w].extra_ms(batch, kv_tokens, base) for w, share in _blend(grids, width)
        )


@dataclass(frozen=True)
class LinearAttention:
    """One slope for every target pass, in ms per KV token beyond the tables' context; the
    draft's attention stays as its tables have it."""

    ms_per_kv_token: float

    def target_extra_ms(self, batch: int, width: int, kv_tokens: int, context_len: int) -> float:
        return self.ms_per_kv_token * (kv_tokens - batch * context_len)

    def draft_extra_ms(self, batch: int, width: int, kv_tokens: int, context_len: int) -> float:
        return 0.0


@dataclass(frozen=True)
class Calibration:
    """A published or measured figure the model reproduces.

    ``mode`` is ``base`` or ``spec`` (decode tok/s of each stream at ``concurrency``) or
    ``speedup`` (total decode throughput with speculation over without).
    """

    mode: str
    concurrency: int
    value: float
    accept_length: float | None
    source: str


@dataclass(frozen=True)
class HardwareModel:
    name: str
    description: str
    source: str
    target: dict[int, Curve]
    draft: Curve
    draft_extend: Curve
    prefill: Curve
    context_len: int
    attention: LinearAttention | ContextAttention
    cuda_graph_max_bs: int
    eager_factor: float
    max_running_requests: int
    speculative_num_steps: int
    accept_length: float
    acceptance_rules: tuple[dict[str, Any], ...]
    calibration: tuple[Calibration, ...]
    raw: dict[str, Any]
    memory: Memory | None = None  # each GPU's and the model's, for the KV cache's size

    def forward_ms(self, batch: int, width: int, kv_tokens: int) -> float:
        """One target forward over ``batch`` requests of ``width`` new tokens each, with
        ``kv_tokens`` of KV cache among them."""
        table = self._target_ms(batch * width, width)
        extra = self.attention.target_extra_ms(batch, width, kv_tokens, self.context_len)
        return _floored(table, extra)

    def draft_forward_ms(self, batch: int, width: int, kv_tokens: int) -> float:
        """One draft step (``width`` 1) or the draft's extend over ``width`` tokens each."""
        table = self.draft(batch) if width == 1 else self.draft_extend(batch * width)
        extra = self.attention.draft_extra_ms(batch, width, kv_tokens, self.context_len)
        return _floored(table, extra)

    def decode_ms(self, batch: int, kv_tokens: int, graph_max_bs: int | None = None) -> float:
        return self._graph(batch, self.forward_ms(batch, 1, kv_tokens), graph_max_bs)

    def speculative_ms(
        self,
        batch: int,
        steps: int,
        kv_tokens: int,
        graph_max_bs: int | None = None,
        extend: bool = True,
    ) -> float:
        """An EAGLE chain step: ``steps`` draft forwards, one verify of ``steps + 1`` tokens
        a request, one draft extend over as many (at depth 0 an adaptive server may skip
        it: ``extend``)."""
        width = steps + 1
        ms = steps * self.draft_forward_ms(batch, 1, kv_tokens) + self.forward_ms(
            batch, width, kv_tokens
        )
        if extend:
            ms += self.draft_forward_ms(batch, width, kv_tokens)
        return self._graph(batch, ms, graph_max_bs)

    def prefill_ms(self, tokens: int, speculative: bool) -> float:
        ms = self.prefill(tokens)
        return ms + self.draft_extend(tokens) if speculative else ms

    def _graph(self, batch: int, ms: float, graph_max_bs: int | None) -> float:
        """Batches above the largest captured CUDA graph run eagerly, and slower."""
        limit = self.cuda_graph_max_bs if graph_max_bs is None else graph_max_bs
        return ms * self.eager_factor if batch > limit else ms

    def _target_ms(self, tokens: int, width: int) -> float:
        return sum(share * self.target[w](tokens) for w, share in _blend(self.target, width))


def _blend(widths: Iterable[int], width: int) -> tuple[tuple[int, float], ...]:
    """The measured widths a pass of ``width`` is read from, with their shares: linear
    between the two around it, the nearest one beyond them."""
    ordered = sorted(widths)
    if width <= ordered[0]:
        return ((ordered[0], 1.0),)
    if width >= ordered[-1]:
        return ((ordered[-1], 1.0),)
    hi = next(w for w in ordered if w >= width)
    lo = max(w for w in ordered if w <= width)
    if hi == lo:
        return ((hi, 1.0),)
    share = (width - lo) / (hi - lo)
    return ((lo, 1 - share), (hi, share))


def _floored(table: float, extra: float) -> float:
    """A short context makes a pass cheaper, never below a tenth of its table's time."""
    return max(table + extra, 0.1 * table)


def available_models() -> list[str]:
    folder = resources.files(_SHIPPED)
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_hardware(name_or_path: str) -> HardwareModel:
    """A shipped model by name, or a user's JSON file by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        try:
            text = path.read_text()
        except OSError as exc:
            raise HardwareError(f"cannot read hardware model {name_or_path!r}: {exc}") from None
    else:
        shipped = resources.files(_SHIPPED).joinpath(f"{name_or_path}.json")
        if not shipped.is_file():
            names = ", ".join(available_models())
            raise HardwareError(f"unknown hardware model {name_or_path!r}; shipped: {names}")
        text = shipped.read_text()
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise HardwareError(f"hardware model {name_or_path!r} is not valid JSON: {exc}") from None
    return parse_hardware(data)


def parse_hardware(data: Any) -> HardwareModel:
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise HardwareError(f"a hardware model must be a JSON object with schema {SCHEMA!r}")
    try:
        name = str(data["name"])
        target = {
            int(width): Curve.from_table(table, f"target[{width}]")
            for width, table in data["target_ms"].items()
        }
        draft = Curve.from_table(data["draft_ms"], "draft_ms")
        model = HardwareModel(
            name=name,
            description=str(data.get("description", "")),
            source=str(data.get("source", "")),
            target=target,
            draft=draft,
            draft_extend=Curve.from_table(data["draft_extend_ms"], "draft_extend_ms"),
            prefill=Curve.from_table(data["prefill_ms"], "prefill_ms"),
            context_len=int(data["context_len"]),
            attention=_attention(data),
            cuda_graph_max_bs=int(data["cuda_graph_max_bs"]),
            eager_factor=float(data.get("eager_factor", 1.0)),
            max_running_requests=int(data["max_running_requests"]),
            speculative_num_steps=int(data["speculative_num_steps"]),
            accept_length=float(data["acceptance"]["accept_length"]),
            acceptance_rules=tuple(data["acceptance"].get("rules", [])),
            calibration=tuple(
                Calibration(
                    mode=str(c["mode"]),
                    concurrency=int(c["concurrency"]),
                    value=float(c["value"]),
                    accept_length=None
                    if c.get("accept_length") is None
                    else float(c["accept_length"]),
                    source=str(c.get("source", "")),
                )
                for c in data.get("calibration", [])
            ),
            raw=data,
            memory=parse_memory(data.get("memory")),
        )
    except KeyError as exc:
        raise HardwareError(f"hardware model is missing the field {exc.args[0]!r}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, HardwareError):
            raise
        raise HardwareError(f"hardware model has a malformed field: {exc}") from None
    if not target or 1 not in target:
        raise HardwareError("target_ms needs a table for width 1 (plain decode)")
    if not 1 <= model.accept_length <= model.speculative_num_steps + 1:
        raise HardwareError(
            f"acceptance.accept_length {model.accept_length} is outside "
            f"[1, speculative_num_steps + 1 = {model.speculative_num_steps + 1}]"
        )
    return model


def _attention(data: dict[str, Any]) -> LinearAttention | ContextAttention:
    """The measured ``context`` section if the model has one, else the one slope."""
    section = data.get("context")
    if section is None:
        return LinearAttention(float(data["attention_ms_per_kv_token"]))
    if "attention_ms_per_kv_token" in data:
        raise HardwareError("give either attention_ms_per_kv_token or a context section, not both")
    if not isinstance(section, dict):
        raise HardwareError("context: expected an object")
    reads = section["attention"]
    if reads not in get_args(Reads):
        raise HardwareError(f"context.attention must be 'shared' or 'per_token', not {reads!r}")
    target = {
        int(width): ContextGrid.from_table(table, f"context.target_ms[{width}]")
        for width, table in section["target_ms"].items()
    }
    if 1 not in target:
        raise HardwareError("context.target_ms needs a table for width 1 (plain decode)")
    if reads == "shared" and len(target) > 1:
        raise HardwareError("context.target_ms: a shared read is plain decode's, give width 1 only")
    draft = ContextGrid.from_table(section["draft_ms"], "context.draft_ms")
    return ContextAttention(cast(Reads, reads), target, draft)
