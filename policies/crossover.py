"""``crossover``: speculate while live concurrency is below the measured crossover.

For: the common case, one speculative and one plain server, or several of each. The
crossover is measured for one server, so it is compared with the load where the request
would run: ``topology=shared`` (each speculative server shares its GPUs with a plain one,
a GPU group) with the load of the least-loaded group, both pools' requests there;
``topology=partitioned`` (each server on GPUs of its own) with the load of the
least-loaded speculative server, spilling the rest to the plain pool. ``hysteresis``
keeps the choice from flapping at the threshold: once above it, a server or group speculates
again only below ``crossover - hysteresis``.

A profile may give several bands of load where speculation pays (``crossover.bands``: a
mixture-of-experts model can lose at low load, where a verify pass reads many more experts
than a decode step, win at medium load and lose again); then a request speculates while its
load lies inside one, and ``hysteresis`` applies at every edge: a server or group that did
not speculate last time speculates again only ``hysteresis`` inside a band.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from specroute.crossing import Band, first_top
from specroute.policies.decision import Decision, PolicyError
from specroute.policies.params import parse_params
from specroute.policies.policy import seated
from specroute.policies.profile import Profile, up_to
from specroute.policies.view import RequestInfo, View

Topology = Literal["shared", "partitioned"]
TOPOLOGY = (  # the help of every policy's topology parameter
    "shared: a speculative server shares its GPUs with a plain one; partitioned: each server "
    "has GPUs of its own"
)


@dataclass(frozen=True)
class CrossoverParams:
    crossover: float | None = field(
        default=None, metadata={"help": "the threshold of load; the profile's when not given"}
    )
    topology: Topology = field(default="shared", metadata={"help": TOPOLOGY})
    hysteresis: float = field(
        default=0.0,
        metadata={"help": "out of a band, a server or group speculates again only this far in"},
    )

    def __post_init__(self) -> None:
        if self.crossover is not None and self.crossover < 0:
            raise ValueError(f"crossover must be >= 0, got {self.crossover}")
        if self.hysteresis < 0:
            raise ValueError(f"hysteresis must be >= 0, got {self.hysteresis}")


class CrossoverPolicy:
    name = "crossover"

    def __init__(
        self, params: CrossoverParams, threshold: float, bands: tuple[Band, ...] | None = None
    ) -> None:
        self.params = params
        self.threshold = threshold  # the first band's top: the crossover
        self.bands = bands  # None: one band, up to the threshold
        self._edges = Hysteresis(params.hysteresis)

    @classmethod
    def build(cls, raw: Mapping[str, Any], profile: Profile | None) -> CrossoverPolicy:
        params = parse_params(cls.name, CrossoverParams, raw)
        if params.crossover is not None:
            return cls(params, params.crossover)
        if profile is None:
            raise PolicyError(
                "failed to parse the parameters of the 'crossover' policy: "
                "give crossover=N or a profile (or serve with --online adopt, which starts "
                "from none: speculating nowhere until the live crossover is sure)"
            )
        crossover = profile.crossover
        bands = crossover.given_bands
        if not bands:
            return cls(params, crossover.threshold, bands)
        return cls(params, first_top(bands), bands)

    def choose(self, request: RequestInfo, view: View) -> Decision:
        """The new request joins ``load + 1`` concurrent ones where it would run: speculate
        if that is at or below the crossover."""
        seat = view.seat(self.params.topology)
        live = view.live_bands[0] if len(view.live_bands) == 1 else None
        if live is not None:
            bands = live  # learned from live traffic (online adopt): a crossover, or bands
        else:
            bands = up_to(self.threshold) if self.bands is None else self.bands
        out = not self._edges.inside(seat.key, seat.load + 1, bands)
        if self.bands is None:
            reason = "above_crossover" if out else "below_crossover"
        else:
            reason = "outside_band" if out else "inside_band"
        if out:
            return seated(view, seat.base, "base", reason)
        return seated(view, seat.spec, "spec", reason)

    def crossover(self) -> float | None:
        return self.threshold

    def describe(self) -> dict[str, Any]:
        bands = {} if self.bands is None else {"bands": [list(b) for b in self.bands]}
        return (
            {"crossover": self.threshold}
            | bands
            | {k: v for k, v in asdict(self.params).items() if k != "crossover"}
        )


class Hysteresis:
    """Whether a load lies inside bands, remembered per server or group so that the choice
    does not flap at an edge: one that was outside last time must come ``hysteresis``
    inside a band to speculate again."""

    def __init__(self, hysteresis: float) -> None:
        self.hysteresis = hysteresis
        self._out: dict[str, bool] = {}  # by server or group: not speculating last time

    def inside(self, key: str, load: float, bands: tuple[Band, ...]) -> bool:
        margin = self.hysteresis if self._out.get(key, False) else 0.0
        inside = any(_inside(load, band, margin) for band in bands)
        self._out[key] = not inside
        return inside


def within(load: float, bands: tuple[Band, ...]) -> bool:
    """``load`` inside one of ``bands``, edges included."""
    return any(_inside(load, band, 0.0) for band in bands)


def _inside(load: float, band: Band, margin: float) -> bool:
    """``load`` inside ``band``, ``margin`` in from each closed edge."""
    start, end = band
    return (start is None or load >= start + margin) and (end is None or load <= end - margin)
