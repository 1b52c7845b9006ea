"""The profile file, ``specroute.profile/v1`` or ``/v2``: what calibration measured, read by
policies.

Kept small and versioned. Required: ``crossover.value`` (the concurrency where speculation
stops paying, or null when it paid or lost at every level measured, with ``bound`` saying
which) and ``crossover.ci`` (its confidence interval, ``[low, high]``; either end may
be null when the interval is open on that side, as ``ci_open`` says: ``[8.2, null]`` reads
"at least 8.2"; it need not contain the value). Everything else is optional metadata that
tells whether the profile still applies (settings, workload, date), and what calibration
found: every crossing (``crossings``) and the rule that picked ``value`` (``rule``).

``v2`` adds the context axis, ``context``: ``tokens_per_byte`` (prompt tokens per byte of
prompt text, as calibration measured them, for estimating a request's context without a
tokenizer) and ``buckets``, each a ``context`` (mean KV tokens per request of the bucket's
requests while they decode) and a ``crossover`` object of the same form as the top-level
one; a bucket may also give its ``levels`` and each backend's median time per output token
at each (``tpot_ms: {spec: [...], base: [...]}``), which ``expected-latency`` reads at the
context mix a request would join. The top-level ``crossover`` stays, so a reader of ``v1``
fields finds what it always did; a ``v1`` profile has no context axis.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TypeGuard

from specroute.crossing import Band

SCHEMA = "specroute.profile/v1"
SCHEMA_V2 = "specroute.profile/v2"  # with the context axis


class ProfileError(ValueError):
    """A profile that cannot be used, with the reason."""


def up_to(threshold: float) -> tuple[Band, ...]:
    """The one band of a single crossover: from the lowest load up to ``threshold``."""
    return () if threshold <= 0 else ((None, None if math.isinf(threshold) else threshold),)


@dataclass(frozen=True)
class Crossover:
    value: float | None
    ci: tuple[float | None, float | None] | None  # None at an open end
    bound: Literal["above", "below"] | None = None  # value is None: spec wins/loses everywhere
    limit: float | None = None  # the last (above) or first (below) level measured
    given_bands: tuple[Band, ...] | None = None  # ``bands``, when the profile has them

    @property
    def bands(self) -> tuple[Band, ...]:
        """The loads where speculation pays, lowest first: the profile's ``bands`` (a
        mixture-of-experts model may lose at low load, win at medium and lose again), or
        else the one band up to the crossover (or the edge of what was measured)."""
        return self.given_bands if self.given_bands is not None else up_to(self.threshold)

    @property
    def threshold(self) -> float:
        """The concurrency to route by: the crossover; when there is none, the edge of what
        was measured (speculate up to the last level where it paid, and not past it, where
        nothing was measured; not at all when it lost from the first level)."""
        if self.value is not None:
            return self.value
        if self.bound == "above":
            return math.inf if self.limit is None else self.limit
        return 0.0

    @property
    def note(self) -> str | None:
        """What routing by a bound means, in words; None for a measured crossover, and for
        bands whose edges were measured (a profile where speculation paid only from some
        load up has no crossover ``value``, but routes by what it measured)."""
        if self.value is not None or (self.given_bands and self.given_bands[0][0] is not None):
            return None
        if self.bound == "below":
            return (
                "speculation paid at no level measured: the router does not speculate "
                f"(the first level measured was {self.limit})"
            )
        if self.limit is None:
            return "speculation paid at every level measured, and the profile says no limit"
        return (
            f"speculation paid at every level measured, up to {self.limit:g}: the router "
            f"speculates up to {self.limit:g} and not past it, where nothing was measured "
            "(calibrate with a higher --max-concurrency to know more)"
        )


@dataclass(frozen=True)
class ContextBucket:
    context: float  # mean KV tokens per request while decoding (prompt plus output so far)
    crossover: Crossover


@dataclass(frozen=True)
class ContextAxis:
    """The crossover per context bucket, ascending in context."""

    tokens_per_byte: float
    buckets: tuple[ContextBucket, ...]

    def bands_at(
        self, context: float, live: Sequence[tuple[Band, ...] | None] = ()
    ) -> tuple[Band, ...]:
        """The bands where speculation pays for requests of ``context`` KV tokens: between
        two buckets that each have one crossover (one band from the lowest load), that
        crossover interpolated linearly in log context and log load, as a crossover is
        between levels; otherwise the nearer bucket's bands (in log context); beyond the
        end buckets, theirs. ``live``: per bucket, the bands learned from live traffic that
        stand for the profile's (None: the profile's; as many as the buckets, else none)."""
        given = [b.crossover.bands for b in self.buckets]
        if len(live) == len(given):
            given = [p if b is None else b for p, b in zip(given, live, strict=True)]
        buckets = self.buckets
        if context <= buckets[0].context:
            return given[0]
        if context >= buckets[-1].context:
            return given[-1]
        hi = next(i for i, b in enumerate(buckets) if b.context >= context)
        below, above = buckets[hi - 1], buckets[hi]
        share = math.log(context / below.context) / math.log(above.context / below.context)
        lo_bands, hi_bands = given[hi - 1], given[hi]
        if one_crossover(lo_bands) and one_crossover(hi_bands):
            low, high = lo_bands[0][1], hi_bands[0][1]
            assert low is not None and high is not None
            return up_to(low * (high / low) ** share)
        return lo_bands if share < 0.5 else hi_bands


def one_crossover(bands: tuple[Band, ...]) -> bool:
    """One band from the lowest load up to a closed top: a single crossover."""
    return len(bands) == 1 and bands[0][0] is None and bands[0][1] is not None


@dataclass(frozen=True)
class Profile:
    crossover: Crossover
    created: str | None = None  # ISO 8601, when the measurement ended
    raw: dict[str, Any] = field(default_factory=dict)
    context: ContextAxis | None = None  # schema v2

    @property
    def accept_length(self) -> float | None:
        """The mean accept length the speculative server was measured at, if it says."""
        accept = (self.raw.get("acceptance") or {}).get("mean_accept_length")
        return float(accept) if isinstance(accept, int | float) else None

    @property
    def contexts(self) -> tuple[float, ...]:
        """The contexts (mean KV tokens per request while it decodes: its prompt and half its
        answer) the profile was measured at: each bucket's (v2), else its workload's when it
        says (calibration's mean prompt and output tokens, or a prediction's lengths)."""
        if self.context is not None:
            return tuple(b.context for b in self.context.buckets)
        workload = self.raw.get("workload")
        if not isinstance(workload, dict):
            return ()
        prompt = _first_count(workload, "mean_prompt_tokens", "input_len")
        output = _first_count(workload, "mean_output_tokens", "output_len")
        return () if prompt is None or output is None else (prompt + output / 2,)

    def age_seconds(self, now: datetime | None = None) -> float | None:
        """How old the measurement is; None when the profile does not say when it was made."""
        if self.created is None:
            return None
        try:
            created = datetime.fromisoformat(self.created)
        except ValueError:
            return None
        if created.tzinfo is None:
            created = created.replace(tzinfo=UTC)
        return ((now or datetime.now(UTC)) - created).total_seconds()


def _crossover(data: Any, where: str) -> Crossover:
    if not isinstance(data, dict):
        raise ProfileError(f"{where} must be an object with 'value' and 'ci'")
    value, ci, bound = data.get("value"), data.get("ci"), data.get("bound")
    if value is None:
        if bound not in ("above", "below"):
            raise ProfileError(f"{where}.value is null, so {where}.bound must be above or below")
        limit = data.get("limit")
        limit = None if limit is None else float(limit)
        return Crossover(None, None, bound, limit, given_bands=_bands(data, where))
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ProfileError(f"{where}.value must be a positive number, got {value!r}")
    if (
        not isinstance(ci, list)
        or len(ci) != 2
        or not all(x is None or _number(x) for x in ci)
        or (ci[0] is not None and ci[1] is not None and ci[0] > ci[1])
    ):
        raise ProfileError(f"{where}.ci must be [low, high], null at an open end, got {ci!r}")
    opened = data.get("ci_open")
    if opened not in (None, "above", "below", "both"):
        raise ProfileError(f"{where}.ci_open must be above, below or both, got {opened!r}")
    low, high = (None if x is None else float(x) for x in ci)
    return Crossover(float(value), (low, high), given_bands=_bands(data, where))


def _bands(data: dict[str, Any], where: str) -> tuple[Band, ...] | None:
    """``bands``: ``[[from, to], ...]``, ascending and apart, null at an open end (from the
    lowest load, or with no top)."""
    bands = data.get("bands")
    if bands is None:
        return None
    problem = f"{where}.bands must be [[from, to], ...], ascending, null at an open end"
    if not isinstance(bands, list):
        raise ProfileError(f"{problem}, got {bands!r}")
    found: list[Band] = []
    edge = -math.inf
    for band in bands:
        if (
            not isinstance(band, list)
            or len(band) != 2
            or not all(x is None or _number(x) for x in band)
        ):
            raise ProfileError(f"{problem}, got {band!r}")
        start = -math.inf if band[0] is None else float(band[0])
        end = math.inf if band[1] is None else float(band[1])
        if start < edge or start >= end or (band[0] is None and found):
            raise ProfileError(f"{problem}, got {bands!r}")
        edge = end
        found.append((None if band[0] is None else start, None if band[1] is None else end))
    return tuple(found)


def _first_count(data: dict[str, Any], *keys: str) -> float | None:
    """The first of ``keys`` in ``data`` that holds a number of tokens."""
    for key in keys:
        value = data.get(key)
        if _number(value) and value >= 0:
            return float(value)
    return None


def _number(x: Any) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def parse_profile(data: Any) -> Profile:
    if not isinstance(data, dict):
        raise ProfileError("a profile must be a JSON object")
    schema = data.get("schema")
    if schema not in (SCHEMA, SCHEMA_V2):
        raise ProfileError(
            f"unsupported profile schema {schema!r}; expected {SCHEMA!r} or {SCHEMA_V2!r}"
        )
    if "crossover" not in data:
        raise ProfileError("a profile needs 'crossover'")
    created = data.get("created")
    context = _context(data.get("context")) if schema == SCHEMA_V2 else None
    return Profile(
        _crossover(data["crossover"], "crossover"),
        str(created) if created else None,
        data,
        context,
    )


def _context(data: Any) -> ContextAxis:
    if not isinstance(data, dict):
        raise ProfileError("a v2 profile needs 'context' with tokens_per_byte and buckets")
    ratio, buckets = data.get("tokens_per_byte"), data.get("buckets")
    if not _number(ratio) or ratio <= 0:
        raise ProfileError(f"context.tokens_per_byte must be a positive number, got {ratio!r}")
    if not isinstance(buckets, list) or not buckets:
        raise ProfileError("context.buckets must be a list of {context, crossover}")
    parsed: list[ContextBucket] = []
    for i, bucket in enumerate(buckets):
        where = f"context.buckets[{i}]"
        tokens = bucket.get("context") if isinstance(bucket, dict) else None
        if not _number(tokens) or tokens <= 0:
            raise ProfileError(f"{where}.context must be a positive number, got {tokens!r}")
        if parsed and tokens <= parsed[-1].context:
            raise ProfileError("context.buckets must be in ascending context")
        parsed.append(ContextBucket(float(tokens), _crossover(bucket.get("crossover"), where)))
    return ContextAxis(float(ratio), tuple(parsed))


def load_profile(path: str | Path) -> Profile:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ProfileError(f"cannot read profile {str(path)!r}: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise ProfileError(f"profile {str(path)!r} is not valid JSON: {exc}") from None
    return parse_profile(data)


def save_profile(document: dict[str, Any], path: str | Path) -> Profile:
    """Write a profile after checking that it reads back; the profiler writes through this."""
    profile = parse_profile(document)
    Path(path).write_text(json.dumps(document, indent=1) + "\n")
    return profile
