"""Each policy's parameters as a frozen dataclass: the one parser of ``KEY=VALUE`` text (the
``--policy-param`` flag and the ``NAME:KEY=VALUE`` spec alike), the typed values built from
the dataclass, and the help text listing them. Errors name the policy and the key."""

from __future__ import annotations

import dataclasses
import textwrap
import types
import typing
from collections.abc import Iterable
from typing import Any, TypeVar

from specroute.policies.decision import PolicyError

P = TypeVar("P")


def pairs(items: Iterable[str], where: str) -> dict[str, str]:
    """``KEY=VALUE`` items as text, each key once; ``where`` starts each error (the policy,
    or the flag the items came from)."""
    found: dict[str, str] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or not key or not value:
            raise PolicyError(f"{where}: parameters are KEY=VALUE, got {item!r}")
        if found.get(key, value) != value:
            raise PolicyError(f"{where}: {key} is given twice ({found[key]!r} and {value!r})")
        found[key] = value
    return found


def parse_params(policy: str, cls: type[P], raw: typing.Mapping[str, Any]) -> P:
    """Build ``cls`` from ``raw``: unknown keys and wrong types are refused by name."""
    return cls(**checked(policy, cls, raw))


def checked(policy: str, cls: type, raw: typing.Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``raw`` with their values as ``cls`` types them (text read as a number
    where it takes one), after building ``cls`` from them, which checks them together."""
    fields = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - fields)
    if unknown:
        known = ", ".join(sorted(fields))
        raise PolicyError(
            f"policy {policy!r}: unknown parameter{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(map(repr, unknown))} ({f'known: {known}' if known else 'it takes none'})"
        )
    hints = typing.get_type_hints(cls)
    values = {key: _coerce(policy, key, hints[key], value) for key, value in raw.items()}
    try:
        cls(**values)
    except (TypeError, ValueError) as exc:
        raise PolicyError(f"policy {policy!r}: {exc}") from None
    return values


def help_lines(cls: type, indent: int = 4, width: int = 79) -> list[str]:
    """One entry per parameter of ``cls``, wrapped to ``width``: ``KEY=KIND``, what its
    field's ``metadata["help"]`` says it is for, and its default."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        default = "none" if f.default in (None, dataclasses.MISSING) else f"{f.default}"
        about = f.metadata.get("help", "")
        rows.append((f"{f.name}={kind(hints[f.name])}", f"{about} (default: {default})".strip()))
    column = indent + max((len(name) for name, _ in rows), default=0) + 2
    return [
        textwrap.fill(
            f"{' ' * indent}{name:<{column - indent}}{about}",
            width,
            subsequent_indent=" " * column,
            break_on_hyphens=False,
        )
        for name, about in rows
    ]


def kind(hint: Any) -> str:
    """What a value must be, in a user's words: NUMBER, INTEGER, TEXT or its choices."""
    words = {float: "NUMBER", int: "INTEGER", str: "TEXT"}
    return "|".join(_kind(option, words) for option in _options(hint) if option is not type(None))


def _kind(option: Any, words: dict[type, str]) -> str:
    if typing.get_origin(option) is typing.Literal:
        return "|".join(map(str, typing.get_args(option)))
    return words.get(option, str(option))


def _options(hint: Any) -> tuple[Any, ...]:
    union = isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union
    return typing.get_args(hint) if union else (hint,)


def _coerce(policy: str, key: str, hint: Any, value: Any) -> Any:
    for option in _options(hint):
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
    raise PolicyError(f"policy {policy!r}: {key}={value!r}: expected {kind(hint)}")
