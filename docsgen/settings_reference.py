"""The router's settings reference, read from the pydantic model ``RouterSettings``: every
setting with its type, default, environment variable, TOML key, flag and constraints."""

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
    """One row per setting, in the model's order, each with an anchor to link to."""
    prefix = str(RouterSettings.model_config.get("env_prefix", ""))
    flags = _serve_flags()
    rows = []
    for name, field in RouterSettings.model_fields.items():
        about = " ".join((field.description or "").split())
        if bounds := bounds_text(field):
            about = f"{about} (allowed: {bounds})".strip()
        if field.exclude:  # the settings file itself: given as a flag, never read from one
            env, key = "", ""
        else:
            env, key = f"{prefix}{name}".upper(), name
        rows.append(
            [
                f'<a id="{name}"></a>{code(key or name)}',
                code(type_text(field.annotation)),
                code(default_text(field)),
                code(env),
                code(flags.get(name, "")),
                about,
            ]
        )
    return table(["setting (TOML key)", "type", "default", "environment", "flag", "what"], rows)
