"""The import directions as the contract in ``pyproject.toml`` states them (``make lint``
checks it): its layers from the top down, and its other contracts."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from docsgen.markdown import code, table

ROOT = Path(__file__).resolve().parents[1]


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def imports_reference() -> str:
    contracts = _contracts()
    layered = [c for c in contracts if c["type"] == "layers"]
    others = [f"- {c['name']} (`{c['type']}`)" for c in contracts if c not in layered]
    return "\n\n".join([*(_layers(c) for c in layered), "The other contracts:", "\n".join(others)])


def _layers(contract: dict[str, Any]) -> str:
    """One layers contract as a table, top layer first; inside a container, its parts."""
    inside = contract.get("containers", ["specroute"])[0]
    rows = [
        (str(i), ", ".join(code(m.strip().removeprefix("specroute.")) for m in layer.split("|")))
        for i, layer in enumerate(contract["layers"], 1)
    ]
    return "\n".join(
        [
            f"{contract['name']}: each layer imports only the layers below it, and the parts "
            "side by side in one layer import none of each other.",
            "",
            table(["layer", f"parts of `{inside}`"], rows, "rl"),
        ]
    )
