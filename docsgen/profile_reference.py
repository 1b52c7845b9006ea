"""The profile schema, read from its reader ``specroute.policies.profile``: the schemas it
accepts, what it says of the format, the fields it reads into, and every rule it enforces
(each ``ProfileError`` it raises, in the order it checks them)."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

from docsgen.markdown import code, table
from specroute.policies import profile as reader

_WHERE = "where"  # the reader's name for the path of the crossover object it checks


def _source() -> tuple[ast.Module, list[str]]:
    text = inspect.getsource(reader)
    return ast.parse(text), text.splitlines()


def _text(node: ast.expr, names: dict[str, ast.expr]) -> str:
    """A message as a reader of the docs needs it: its constant words, ``{where}`` for the
    object's path, and ``…`` for the value that was found."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.Name) and node.id in names:
        return _text(names[node.id], names)
    if isinstance(node, ast.JoinedStr):
        return "".join(_text(part, names) for part in node.values)
    if isinstance(node, ast.FormattedValue):
        inner = node.value
        if isinstance(inner, ast.Name) and inner.id == _WHERE:
            return "{where}"
        if isinstance(inner, ast.Name) and inner.id in names:
            return _text(names[inner.id], names)
        if isinstance(inner, ast.Name) and isinstance(getattr(reader, inner.id, None), str):
            return repr(getattr(reader, inner.id))
    return "…"


def rules() -> list[str]:
    """Each check the reader makes, as its error says it, the value found left out."""
    module, _ = _source()
    found: list[str] = []
    for function in (n for n in module.body if isinstance(n, ast.FunctionDef)):
        names = {
            target.id: node.value
            for node in ast.walk(function)
            if isinstance(node, ast.Assign)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(function):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                continue
            call = node.exc
            if not (isinstance(call.func, ast.Name) and call.func.id == "ProfileError"):
                continue
            message = _text(call.args[0], names).split(", got ")[0].split(": {")[0]
            if message not in found and "cannot read" not in message:
                found.append(message)
    return found


def fields() -> str:
    """The dataclasses the reader reads a profile into, each field with its type and the
    comment beside it, and the properties a policy reads, with their contracts."""
    module, lines = _source()
    rows = []
    for cls in (n for n in module.body if isinstance(n, ast.ClassDef)):
        for node in cls.body:
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                comment = lines[node.lineno - 1].partition("  # ")[2]
                kind = code(ast.unparse(node.annotation))
                rows.append([code(f"{cls.name}.{node.target.id}"), kind, comment])
            elif isinstance(node, ast.FunctionDef) and any(
                isinstance(d, ast.Name) and d.id == "property" for d in node.decorator_list
            ):
                doc = (ast.get_docstring(node) or "").split("\n\n")[0]
                rows.append([code(f"{cls.name}.{node.name}"), "property", doc])
    return table(["field", "type", "what"], rows)


def profile_reference() -> str:
    doc = inspect.getdoc(reader) or ""
    schemas = ", ".join(code(s) for s in (reader.SCHEMA, reader.SCHEMA_V2))
    parts = [
        f"Schemas read: {schemas}.\n",
        doc.split("\n\n", 1)[1] if "\n\n" in doc else doc,
        "\n### Rules\n",
        "What the reader refuses, as its source checks it, function by function: each is the "
        "error a profile that breaks it stops the router with. `{where}` is `crossover`, or "
        "`context.buckets[i]` for a bucket's crossover.\n",
        "\n".join(f"- {code(rule)}" for rule in rules()) + "\n",
        "### What it reads into\n",
        fields(),
    ]
    return "\n".join(parts)


def profile_example(path: Path) -> str:
    """A committed profile, checked to load, shown with its long per-level data cut."""
    document = json.loads(path.read_text())
    reader.parse_profile(document)
    shown = {k: v for k, v in document.items() if k not in ("levels", "measurement")}
    return f"```json\n{json.dumps(shown, indent=1)}\n```\n"
