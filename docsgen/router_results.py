"""Tables of the router's and the emulator's benchmarks: overhead, replicas, chaos, soak,
capacity, each read from the JSON its command wrote."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Loader = Callable[[str], Any]


def blocks(load: Loader) -> dict[str, Callable[..., str]]:
    return {}
