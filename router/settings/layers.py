"""The settings' sources as layers, flags over environment over file, merged as pydantic-settings
merges them, each setting by its flat spelling whichever a layer used (a file's ``[health]``
table or its ``health_interval``), with a policy's parameters resolved between their two
spellings.

A parameter is given in its own table (``--policy-param``, ``SPECROUTE_POLICY_PARAMS``, the
file's ``[policy.params]``) or, deprecated, as a setting of its own (``--crossover``,
``SPECROUTE_CROSSOVER``, ``crossover = 4``). Whichever the spelling, it comes from the
highest layer that gives it, so a flag overrides a file in either; both spellings in one
layer are kept, and the settings refuse them if they differ."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsError

from specroute.policies.registry import FLAT_KEYS
from specroute.router.settings.spelling import PARAMS, flattened, nested


class Layers(PydanticBaseSettingsSource):
    def __init__(
        self, settings_cls: type[BaseSettings], layers: Sequence[PydanticBaseSettingsSource]
    ) -> None:
        super().__init__(settings_cls)
        self.layers = tuple(layers)  # highest first

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # unused: each layer reads its own fields

    def __call__(self) -> dict[str, Any]:
        merged: dict[str, Any] = {}
        given: set[str] = set()  # parameters given so far, in either spelling
        for layer in self.layers:
            values = _policy_table(flattened(_read(layer)))
            higher = set(given)
            table = values.get(PARAMS)
            if isinstance(table, dict):  # anything else is refused by the field's type
                values[PARAMS] = {k: v for k, v in table.items() if k not in higher}
                given |= set(table)
            for key in FLAT_KEYS:
                if values.get(key) is not None:
                    if key in higher:
                        del values[key]
                    given.add(key)
            merged = _under(merged, values)
        return nested(merged)


def _read(layer: PydanticBaseSettingsSource) -> dict[str, Any]:
    try:
        return dict(layer())
    except SettingsError as exc:  # it names the field, where a user wrote the variable
        if 'field "given_params"' not in str(exc):
            raise
        raise ValueError(
            "SPECROUTE_POLICY_PARAMS is not JSON: give an object, like '{\"crossover\": 40}'"
        ) from None


def _policy_table(values: dict[str, Any]) -> dict[str, Any]:
    """A ``[policy]`` table (``name``, ``params``) as the ``policy`` setting and the
    parameters' table; the parameters' table under one name."""
    if "given_params" in values:  # the field's own name, as keywords may give it
        values[PARAMS] = values.pop("given_params")
    table = values.get("policy")
    if not isinstance(table, dict):
        return values
    unknown = sorted(set(table) - {"name", "params"})
    if unknown:
        raise ValueError(f"[policy] takes name and params, got {', '.join(unknown)}")
    del values["policy"]
    if "name" in table:
        values["policy"] = table["name"]
    if "params" in table:
        values[PARAMS] = table["params"]
    return values


def _under(higher: dict[str, Any], lower: dict[str, Any]) -> dict[str, Any]:
    """``lower`` with ``higher`` over it, the parameters' table merged key by key."""
    merged = lower | higher
    below, above = lower.get(PARAMS), higher.get(PARAMS)
    if isinstance(below, dict) and isinstance(above, dict):
        merged[PARAMS] = below | above
    return merged
