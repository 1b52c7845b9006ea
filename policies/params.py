"""Each policy's parameters as a frozen dataclass, parsed with errors naming policy and key."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

from specroute.policies.decision import PolicyError

P = TypeVar("P")


def parse_params(policy: str, cls: type[P], raw: typing.Mapping[str, Any]) -> P:
    """Build ``cls`` from ``raw``: unknown keys and wrong types are refused by name."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise PolicyError(
            f"failed to parse the parameters of the {policy!r} policy: unknown key(s) "
            f"{', '.join(unknown)}; known: {', '.join(fields) or 'none'}"
        )
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for key, value in raw.items():
        values[key] = _coerce(policy, key, hints[key], value)
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise PolicyError(
            f"failed to parse the parameters of the {policy!r} policy: {exc}"
        ) from None


def _coerce(policy: str, key: str, hint: Any, value: Any) -> Any:
    options = typing.get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    for option in options:
        if option is type(None) and value is None:
            return None
        if option is float and isinstance(value, (int, float, str)) and not isinstance(value, bool):
            try:
                return float(value)
            except ValueError:
                continue
        if option is int and isinstance(value, (int, str)) and not isinstance(value, bool):
            try:
                return int(value)
            except ValueError:
                continue
        if option is str and isinstance(value, str):
            return value
        if typing.get_origin(option) is typing.Literal and value in typing.get_args(option):
            return value
    raise PolicyError(
        f"failed to parse the parameters of the {policy!r} policy: {key}={value!r} is not {hint}"
    )
