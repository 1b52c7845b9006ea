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


def _answered(answer: dict[str, Any]) -> str:
    """`` (`Model`)`` when the answer's JSON is one of the router's models."""
    ref = answer.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
    return "" if ref is None else f" (`{ref.rsplit('/', 1)[-1]}`)"


def _type(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " | ".join(_type(s) for s in schema["anyOf"])
    if schema.get("type") == "array":
        return f"list[{_type(schema.get('items', {}))}]"
    if "enum" in schema or "const" in schema:
        return " | ".join(str(v) for v in schema.get("enum", [schema.get("const")]))
    return str(schema.get("type", "any"))


def _models() -> str:
    """Each model of the router's own answers, a field a row (the schemas with a title
    are the models'; the proxied bodies' are kept by hand and have none)."""
    sections = []
    for name, schema in document()["components"]["schemas"].items():
        if "title" not in schema:
            continue
        required = set(schema.get("required", []))
        rows = [
            [
                code(field),
                code(_type(about)),
                "yes" if field in required else "",
                about.get("description", ""),
            ]
            for field, about in schema.get("properties", {}).items()
        ]
        said = f"{schema['description']}\n\n" if "description" in schema else ""
        fields = table(["field", "type", "always", "what"], rows)
        sections.append(f"### `{name}`\n\n{said}{fields}\n")
    return "\n".join(sections)


def endpoints_reference() -> str:
    """A summary table, then each endpoint with its answers, then the models of the
    router's own answers."""
    rows, sections = [], []
    for path, operations in document()["paths"].items():
        for method, operation in operations.items():
            name = f"{method.upper()} {path}"
            rows.append([code(name), operation.get("summary", ""), _key(operation)])
            answers = "\n".join(
                f"- `{status}`{_answered(answer)}: {answer.get('description', '')}"
                for status, answer in operation.get("responses", {}).items()
            )
            sections.append(f"### `{name}`\n\n{operation.get('summary', '')}\n\n{answers}\n")
    models = f"## The router's own answers\n\n{_models()}"
    return "\n".join([table(["endpoint", "what", "key"], rows), *sections, models])
