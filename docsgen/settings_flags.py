"""Writes ``specroute/settings_flags.py``'s table from the router's settings model
(``python -m docsgen.settings_flags``): each setting of a number that no flag of ``serve``
declared by hand takes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from docsgen.cli_reference import commands
from specroute.cli import parser
from specroute.router.settings import RouterSettings
from specroute.settings_flags import FLAGS

MODULE = Path(__file__).resolve().parents[1] / "specroute" / "settings_flags.py"


def generated(declared: set[str]) -> tuple[tuple[str, str, str], ...]:
    """The table from the settings model: each setting of a number that ``declared`` (the
    hand-declared flags' destinations) lacks."""
    rows = []
    for name, field in RouterSettings.model_fields.items():
        kind = getattr(field.annotation, "__name__", "")
        if name in declared or kind not in ("int", "float"):
            continue
        about = (field.description or "").replace("%", "%%")
        rows.append((f"--{name.replace('_', '-')}", kind, f"{about} (default {field.default})"))
    return tuple(rows)


def written(rows: tuple[tuple[str, str, str], ...]) -> str:
    """The flags module's source with ``rows`` as its table."""
    source = MODULE.read_text()
    start = source.index("FLAGS: tuple")
    end = source.index("\n)\n", start) + 3
    lines = [
        "FLAGS: tuple[tuple[str, str, str], ...] = (",
        *(f"    {row!r}," for row in rows),
        ")\n",
    ]
    return source[:start] + "\n".join(lines) + source[end:]


def serve_parser() -> argparse.ArgumentParser:
    """``specroute serve``'s parser, as the command line builds it."""
    return dict(commands(parser()))["specroute serve"]


def declared() -> set[str]:
    """The destinations of ``serve``'s flags declared by hand (this table's left out)."""
    ours = {flag.lstrip("-").replace("-", "_") for flag, _, _ in FLAGS}
    return {a.dest for a in serve_parser()._actions} - ours


if __name__ == "__main__":
    rows = generated(declared())
    MODULE.write_text(written(rows))
    print(f"{len(rows)} flags written; run `ruff format` on {MODULE}", file=sys.stderr)
