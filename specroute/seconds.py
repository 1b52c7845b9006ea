"""A duration read from text, as a query parameter gives it (SGLang's ``/flush_cache``
``timeout``, which the emulator answers and the router passes on)."""

from __future__ import annotations

import math


def seconds(raw: str | None) -> float:
    """``raw`` as seconds, 0 when absent; ValueError, saying why, unless it is a finite
    number of at least 0."""
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"timeout must be a number of seconds, not {raw!r}") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"timeout must be a finite number of seconds >= 0, not {raw!r}")
    return value
