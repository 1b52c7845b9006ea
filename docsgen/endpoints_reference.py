"""The router's HTTP endpoints, read from the OpenAPI document it serves at
``/openapi.json`` (``specroute.router.operator.openapi.document``)."""

from __future__ import annotations

from typing import Any

from docsgen.markdown import code, table
from specroute.router.operator.openapi import document


def _key(operation: dict[str, Any]) -> str:
    security = operation.get("security")
    if security == []:
        return "none"
    names = sorted({name for option in security or [] for name in option})
    return ", ".join(names) or "none"


def endpoints_reference() -> str:
    """A summary table, then each endpoint with its answers."""
    rows, sections = [], []
    for path, operations in document()["paths"].items():
        for method, operation in operations.items():
            name = f"{method.upper()} {path}"
            rows.append([code(name), operation.get("summary", ""), _key(operation)])
            answers = "\n".join(
                f"- `{status}`: {answer.get('description', '')}"
                for status, answer in operation.get("responses", {}).items()
            )
            sections.append(f"### `{name}`\n\n{operation.get('summary', '')}\n\n{answers}\n")
    return "\n".join([table(["endpoint", "what", "key"], rows), *sections])
