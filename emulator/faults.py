"""Faults a real deployment has, injected on purpose so that a client's (the router's)
failure handling can be tested: refused connections, error statuses, stalls, cut streams,
a crashing process, a slow engine, compressed answers.

A fault is written ``KIND[:VALUE][,KEY=VALUE...]`` (several joined by ``;``) or as a JSON
object ``{"kind": KIND, KEY: VALUE...}``. Every kind but ``slow`` acts on requests, drawn
per request: on a fraction of them (``probability``, from a generator seeded at each change)
and only on the next ``count`` it is drawn for, after which it is gone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Literal, get_args

Kind = Literal[
    "refuse", "status", "stall_first", "stall_mid", "cut_mid", "crash", "slow", "compress"
]
KINDS: tuple[Kind, ...] = get_args(Kind)

# Each kind's own keys (defaults: the Fault's fields); the first is what KIND:VALUE sets.
_OWN_KEYS: dict[Kind, tuple[str, ...]] = {
    "refuse": (),
    "status": ("status",),
    "stall_first": ("seconds",),
    "stall_mid": ("after", "seconds"),
    "cut_mid": ("after", "mid_event"),
    "crash": ("after",),
    "slow": ("factor",),
    "compress": (),
}
GENERATION_PATHS = frozenset({"/v1/chat/completions", "/v1/completions", "/generate"})
ADMIN_PREFIX = "/emulator/"
CRASH_EXIT_STATUS = 1


class FaultError(ValueError):
    """A fault setting that cannot be used, naming the fault and the key."""


@dataclass(frozen=True)
class Fault:
    kind: Kind
    status: int = 503  # status: the HTTP status answered
    seconds: float | None = None  # stall_first, stall_mid: how long; None stalls forever
    after: int = 0  # stall_mid, cut_mid, crash: SSE events written before it acts
    mid_event: bool = False  # cut_mid: cut inside the next event, not between two
    factor: float = 1.0  # slow: every engine step takes this many times longer
    probability: float = 1.0
    count: int | None = None  # act on the next N requests drawn, then leave

    @property
    def streams_only(self) -> bool:
        """Acts mid-stream, so only on streamed requests."""
        return self.kind in ("stall_mid", "cut_mid") or (self.kind == "crash" and self.after > 0)

    def describe(self) -> dict[str, Any]:
        return {"kind": self.kind} | {key: getattr(self, key) for key in _keys(self.kind)}


def _keys(kind: Kind) -> tuple[str, ...]:
    """All but slow, which paces the whole engine, act per request: a fraction, or N."""
    return _OWN_KEYS[kind] if kind == "slow" else (*_OWN_KEYS[kind], "probability", "count")


_FLAGS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}


def _read(value: Any, kind: type[bool] | type[int] | type[float]) -> Any:
    """A JSON value, or a spec's text, as ``kind``; ValueError if it is not one."""
    if isinstance(value, str):
        text = value.strip().lower()
        if kind is bool:
            if text not in _FLAGS:
                raise ValueError
            return _FLAGS[text]
        value = kind(text)
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, (int, float)):
        raise ValueError  # JSON's true is no number, nor is 1 a flag
    if (kind is int and isinstance(value, float)) or not math.isfinite(value):
        raise ValueError
    return kind(value)


_ERROR_STATUSES = {int(status) for status in HTTPStatus if 400 <= status <= 599}

# How each key's value is read, what it must be, and what it must be in words.
_KEYS: dict[str, tuple[type[bool] | type[int] | type[float], Callable[[Any], bool], str]] = {
    "status": (int, lambda n: n in _ERROR_STATUSES, "an HTTP error status (400-599)"),
    "seconds": (float, lambda x: x > 0, "a positive number of seconds (or none: forever)"),
    "after": (int, lambda n: n >= 0, "a whole number of SSE events, 0 or more"),
    "mid_event": (bool, lambda _: True, "true or false"),
    "factor": (float, lambda x: x >= 1, "a number, 1 or more"),
    "probability": (float, lambda p: 0 < p <= 1, "a number in (0, 1]"),
    "count": (int, lambda n: n >= 1, "a whole number, 1 or more (or none: every request)"),
}
_NONE_ALLOWED = {"seconds", "count"}


def fault_from(kind: Any, given: dict[str, Any]) -> Fault:
    """One fault of ``kind`` with ``given`` parameters (text or JSON values)."""
    if kind not in KINDS:
        raise FaultError(f"unknown fault kind {kind!r} (one of: {', '.join(KINDS)})")
    takes = _keys(kind)
    values: dict[str, Any] = {}
    for key, value in given.items():
        if key not in takes:
            also = f"it takes {', '.join(takes)}" if takes else "it takes no keys"
            raise FaultError(f"fault '{kind}': unknown key {key!r} ({also})")
        read, valid, what = _KEYS[key]
        if value is None and key in _NONE_ALLOWED:
            values[key] = None
            continue
        try:
            values[key] = read_value = _read(value, read)
            if not valid(read_value):
                raise ValueError
        except ValueError:
            raise FaultError(f"fault '{kind}': {key} must be {what}, got {value!r}") from None
    if kind == "slow" and "factor" not in values:
        raise FaultError("fault 'slow': give its factor (slow:F, every step F times longer)")
    return Fault(kind, **values)


def parse_spec(text: str) -> list[Fault]:
    """``KIND[:VALUE][,KEY=VALUE...]``, several joined by ``;``."""
    faults = []
    for spec in filter(None, (part.strip() for part in text.split(";"))):
        head, *pairs = (item.strip() for item in spec.split(","))
        kind, has_value, value = head.partition(":")
        given: dict[str, Any] = {}
        if has_value:
            if kind not in KINDS or not _OWN_KEYS[kind]:
                fault_from(kind, {})  # an unknown kind says so first
                raise FaultError(f"fault '{kind}' takes no value (got {spec!r})")
            given[_OWN_KEYS[kind][0]] = value
        for pair in pairs:
            key, is_pair, text_value = pair.partition("=")
            if not is_pair:
                raise FaultError(f"fault '{kind}': expected KEY=VALUE, got {pair!r} in {spec!r}")
            given[key.strip()] = text_value.strip()
        faults.append(fault_from(kind, given))
    return faults


def parse_faults(items: Iterable[Any]) -> tuple[Fault, ...]:
    """Spec strings (from flags or JSON) and JSON objects; each kind at most once."""
    faults: list[Fault] = []
    for item in items:
        if isinstance(item, str):
            faults.extend(parse_spec(item))
        elif isinstance(item, dict):
            given = dict(item)
            faults.append(fault_from(given.pop("kind", None), given))
        else:
            raise FaultError(f"a fault is a spec string or an object with a 'kind', got {item!r}")
    kinds = [fault.kind for fault in faults]
    for kind in kinds:
        if kinds.count(kind) > 1:
            raise FaultError(f"fault '{kind}' is given twice")
    return tuple(faults)


def parse_change(body: dict[str, Any]) -> tuple[tuple[Fault, ...], int | None]:
    """``{"faults": [...], "seed": N}`` from ``POST /emulator/faults``: the new set (an empty
    list clears) and the seed of its draws, if given."""
    unknown = set(body) - {"faults", "seed"}
    if unknown or not isinstance(body.get("faults"), list):
        extra = f"; unknown field(s): {', '.join(sorted(unknown))}" if unknown else ""
        raise FaultError(f'expected {{"faults": [...], "seed": N}}{extra}')
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise FaultError(f"seed must be an integer, got {seed!r}")
    return parse_faults(body["faults"]), seed
