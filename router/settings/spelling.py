"""Each setting's flat spelling (``health_interval``: the flag ``--health-interval``, the
variable ``SPECROUTE_HEALTH_INTERVAL``, the file's ``health_interval = 2``) and its place in
the settings' parts (``health.interval``, the file's ``[health]`` table). Both spellings are
read; the flat one is the flags' and the environment's, and the one an error names."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from specroute.router.settings.admission import AdmissionSettings
from specroute.router.settings.backends import BackendSettings
from specroute.router.settings.health import HealthSettings
from specroute.router.settings.http import HttpSettings
from specroute.router.settings.observability import ObservabilitySettings
from specroute.router.settings.online import OnlineSettings
from specroute.router.settings.routing import RoutingSettings
from specroute.router.settings.upstream import UpstreamSettings

PARTS: dict[str, type[BaseModel]] = {
    "backends": BackendSettings,
    "routing": RoutingSettings,
    "health": HealthSettings,
    "upstream": UpstreamSettings,
    "http": HttpSettings,
    "admission": AdmissionSettings,
    "observability": ObservabilitySettings,
    "online": OnlineSettings,
}
PARAMS = "specroute_policy_params"  # the parameters' table as the environment names it


def extra_of(field: FieldInfo) -> dict[str, Any]:
    """What a setting's field says of its spelling and its flag (``flat``, ``flag``,
    ``metavar``, ``urls``)."""
    given = field.json_schema_extra
    return dict(given) if isinstance(given, dict) else {}


def _flat(name: str, field: FieldInfo) -> str:
    return str(extra_of(field).get("flat", name))


PLACES: dict[tuple[str, str], str] = {  # (part, name): its flat spelling
    (part, name): _flat(name, field)
    for part, model in PARTS.items()
    for name, field in model.model_fields.items()
}
_BY_FLAT = {flat: place for place, flat in PLACES.items()}


@dataclass(frozen=True)
class Spelling:
    flat: str  # the flag's (with dashes), the environment's (upper case) and the file's
    part: str | None  # None: a setting of the whole router
    name: str  # its name in its part
    field: FieldInfo

    @property
    def extra(self) -> dict[str, Any]:
        return extra_of(self.field)


def spellings(whole: type[BaseModel]) -> dict[str, Spelling]:
    """Every setting of ``whole`` (the router's settings) by its flat spelling, the parts'
    in the order they are declared, then the whole router's own."""
    found = {
        flat: Spelling(flat, part, name, PARTS[part].model_fields[name])
        for (part, name), flat in PLACES.items()
    }
    for name, field in whole.model_fields.items():
        if name not in PARTS:
            found[name] = Spelling(name, None, name, field)
    return found


def flat_name(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """An error's place as its flat spelling: ``("health", "interval")`` is
    ``("health_interval",)``; one inside a list keeps its index; a check of a part's
    settings together has no one place."""
    if len(loc) == 1 and loc[0] in PARTS:  # a check of the part's settings together
        return ()
    place = (str(loc[0]), str(loc[1])) if len(loc) >= 2 else None
    return loc if place not in PLACES else (PLACES[place], *loc[2:])


def flattened(values: Mapping[str, Any]) -> dict[str, Any]:
    """``values`` with each part's table (``{"health": {"interval": 2}}``) as flat keys
    (``health_interval``); a key a part does not know stays as ``part.key`` for the error
    to name. A flat key that a part's name also spells (``online = "adopt"``) is kept."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        if key in PARTS and isinstance(value, Mapping):
            for name, inner in value.items():
                flat[PLACES.get((key, str(name)), f"{key}.{name}")] = inner
        else:
            flat[key] = value
    return flat


def nested(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flat keys into their parts, every part present (an empty one takes its defaults);
    what no part knows stays where it is, for the whole router's model to take or refuse."""
    found: dict[str, Any] = {part: {} for part in PARTS}
    for key, value in flattened(values).items():
        flat = "given_params" if key == PARAMS else key
        part, _, name = flat.partition(".")
        if flat in _BY_FLAT:
            part, name = _BY_FLAT[flat]
            found[part][name] = value
        elif name and part in PARTS:
            found[part][name] = value
        else:
            found[flat] = value
    return found
