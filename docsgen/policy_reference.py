"""Every policy's parameters, read from its dataclass (``specroute.policies.registry``):
the key, what its value must be, what it is for and its default."""

from __future__ import annotations

import dataclasses
import typing

from docsgen.markdown import code, table
from specroute.policies.params import kind
from specroute.policies.registry import REGISTRY


def policy_params_reference() -> str:
    rows = []
    for name, entry in REGISTRY.items():
        hints = typing.get_type_hints(entry.params)
        for f in dataclasses.fields(entry.params):
            default = "" if f.default in (None, dataclasses.MISSING) else code(f.default)
            rows.append(
                (
                    code(name),
                    code(f.name),
                    code(kind(hints[f.name])),
                    f.metadata.get("help", ""),
                    default,
                )
            )
    return table(["policy", "parameter", "value", "what it is for", "default"], rows)
