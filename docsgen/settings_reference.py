"""The router's settings reference, read from the pydantic model ``RouterSettings``: every
setting by its part, with its type, default, environment variable, TOML keys, flag and
constraints."""

from __future__ import annotations

import argparse
import enum
import re
import types
import typing
from typing import Any

from annotated_types import Ge, Gt, Le, Lt
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from docsgen.cli_reference import commands
from docsgen.markdown import code, table
from specroute.cli import parser
from specroute.router.settings import RouterSettings
from specroute.router.settings.spelling import spellings

_BOUNDS = ((Gt, "gt", ">"), (Ge, "ge", ">="), (Lt, "lt", "<"), (Le, "le", "<="))


def type_text(annotation: Any) -> str:
    """A type as a user writes its value: ``list[str]``, ``float | None``, ``auto | off``."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return " | ".join(str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_text(a) for a in args)
    if origin is not None:
        return f"{getattr(origin, '__name__', str(origin))}[{', '.join(map(type_text, args))}]"
    if annotation is type(None):
        return "None"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " | ".join(str(m.value) for m in annotation)
    name = getattr(annotation, "__name__", None) or str(annotation)
    return re.sub(r"\b[a-z_]+\.", "", name)


def default_text(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if isinstance(value, enum.Enum):
        value = value.value
    if value is None:
        return "none"
    if isinstance(value, float) and value.is_integer():
        return f"{value:g}"
    return str(value)


def bounds_text(field: FieldInfo) -> str:
    found = []
    for meta in field.metadata:
        for kind, attribute, sign in _BOUNDS:
            if isinstance(meta, kind):
                found.append(f"{sign} {getattr(meta, attribute)}")
    return ", ".join(found)


def _serve_flags() -> dict[str, str]:
    """Each setting's ``serve`` flag, by the flag's destination."""
    serve = next(p for name, p in commands(parser()) if name == "specroute serve")
    return {
        a.dest: "/".join(a.option_strings)
        for a in serve._actions
        if a.option_strings and not isinstance(a, argparse._HelpAction)
    }


def settings_reference() -> str:
    """A table for each part of the settings, then the whole router's own, each setting in
    the model's order with an anchor (its flat spelling) to link to."""
    prefix = str(RouterSettings.model_config.get("env_prefix", ""))
    flags = _serve_flags()
    parts: dict[str, list[list[str]]] = {}
    for spelling in spellings(RouterSettings).values():
        field, flat = spelling.field, spelling.flat
        about = " ".join((field.description or "").split())
        if bounds := bounds_text(field):
            about = f"{about} (allowed: {bounds})".strip()
        env = "" if field.exclude else f"{prefix}{flat}".upper()
        table_key = f"[{spelling.part}] {spelling.name}" if spelling.part else ""
        parts.setdefault(spelling.part or "", []).append(
            [
                f'<a id="{flat}"></a>{code(flat)}',
                code(table_key),
                code(type_text(field.annotation)),
                code(default_text(field)),
                code(env),
                code(flags.get(flat, "")),
                about,
            ]
        )
    head = ["setting", "in its part's table", "type", "default", "environment", "flag", "what"]
    sections = [
        f"### {part or 'the whole router'}\n\n{table(head, rows)}" for part, rows in parts.items()
    ]
    return "\n\n".join(sections)
