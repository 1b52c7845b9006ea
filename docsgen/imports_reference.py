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
    layers = next(c for c in contracts if c["type"] == "layers")
    rows = [
        (str(i), ", ".join(code(m.strip().removeprefix("specroute.")) for m in layer.split("|")))
        for i, layer in enumerate(layers["layers"], 1)
    ]
    others = [f"- {c['name']} (`{c['type']}`)" for c in contracts if c is not layers]
    return "\n".join(
        [
            f"{layers['name']}: each layer imports only the layers below it, and the parts "
            "side by side in one layer import none of each other.",
            "",
            table(["layer", "parts of `specroute`"], rows, "rl"),
            "",
            "The other contracts:",
            "",
            *others,
        ]
    )
