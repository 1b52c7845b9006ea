"""Writes ``specroute/settings_flags.py``'s table from the router's settings model
(``python -m docsgen.settings_flags``): a flag for every setting, grouped by its part, named
by its flat spelling (or the flag the field names), of its type, with its description and
default as help."""

from __future__ import annotations

import enum
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic import SecretStr

from specroute.policies.registry import FLAT_KEYS, kind_of
from specroute.router.settings import RouterSettings
from specroute.router.settings.spelling import Spelling, spellings

MODULE = Path(__file__).resolve().parents[1] / "specroute" / "settings_flags.py"
_SECONDS = ("interval", "timeout", "seconds", "after", "grace")
Row = tuple[str, str, str, str, str, str]


def _bare(annotation: Any) -> Any:
    """The type without ``| None``."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return args[0] if len(args) == 1 else annotation
    return annotation


def _kind(spelling: Spelling) -> tuple[str, str]:
    """The flag's kind (how argparse takes it) and its metavar."""
    extra, flat = spelling.extra, spelling.flat
    kind = _bare(spelling.field.annotation)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if flat in FLAT_KEYS:
        return "deprecated", kind_of(flat)
    if origin is typing.Literal:
        return "choice:" + "|".join(str(a) for a in args), ""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return "choice:" + "|".join(str(m.value) for m in kind), ""
    if kind is bool:
        return "switch", ""
    if origin is dict:
        return "params", str(extra.get("metavar", "KEY=VALUE"))
    if origin is list and typing.get_origin(args[0]) is list:
        return "group", "URL,URL"
    if origin is list:
        return ("urls", "URL,URL") if extra.get("urls") else ("append", str(extra["metavar"]))
    if kind is int:
        return "int", str(extra.get("metavar", "N"))
    if kind is float:
        seconds = any(word in flat for word in _SECONDS)
        return "float", str(extra.get("metavar", "S" if seconds else "X"))
    if kind is Path:
        return "str", "FILE"
    return "str", str(extra.get("metavar", "KEY" if kind is SecretStr else "VALUE"))


def _about(spelling: Spelling) -> str:
    if spelling.flat in FLAT_KEYS:  # each a setting of its own once; kept for one release
        return f"deprecated: use --policy-param {spelling.flat}=VALUE"
    about = (spelling.field.description or "").replace("%", "%%")
    default = spelling.field.get_default(call_default_factory=True)
    shown = getattr(default, "value", default)
    if shown is None or shown == [] or shown == {}:
        return about
    return f"{about} (default {', '.join(shown) if isinstance(shown, list) else shown})"


def generated() -> tuple[Row, ...]:
    """Each setting's flag: (group, flag, destination, kind, metavar, help)."""
    rows = []
    for spelling in spellings(RouterSettings).values():
        flag = str(spelling.extra.get("flag", "--" + spelling.flat.replace("_", "-")))
        kind, metavar = _kind(spelling)
        group = spelling.part or "router"
        rows.append((group, flag, spelling.flat, kind, metavar, _about(spelling)))
    return tuple(rows)


def written(rows: tuple[Row, ...]) -> str:
    """The flags module's source with ``rows`` as its table."""
    source = MODULE.read_text()
    start = source.index("FLAGS: tuple")
    end = source.index("\n)\n", start) + 3
    lines = [
        "FLAGS: tuple[tuple[str, str, str, str, str, str], ...] = (",
        *(f"    {row!r}," for row in rows),
        ")\n",
    ]
    return source[:start] + "\n".join(lines) + source[end:]


if __name__ == "__main__":
    table = generated()
    MODULE.write_text(written(table))
    print(f"{len(table)} flags written; run `ruff format` on {MODULE}", file=sys.stderr)
