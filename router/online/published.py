"""What the leader publishes of its online fit for the other workers, and how they take it.

The live crossover it routes by goes on the board (``WorkerSync.publish_online``), since
routing needs it; the rest of the fit goes as a document in the workers' folder: the live
curves and crossings of each context bucket whole (every level, so that a worker rebuilds
the same ``LiveFit``s the leader holds, for its status page, its gauges and whatever reads
``Online.fits``), the drift flags, when it was fitted (monotonic time: the machine's clock,
as every worker reads it), the samples it was fitted from and the topology their load was
counted in, so that every worker counts the load its requests join alike, the speculative
pool's accept length the fit stands at with the samples it left out as taught by another
drafter, and what the leader took from each peer replica.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from specroute.online.estimator import Online
from specroute.online.fit import Level, LiveCrossing, LiveEdge, LiveFit
from specroute.policies.view import POOLS, LiveBands
from specroute.router.workers.sync import IN_THE_FIT


def published(online: Online) -> dict[str, Any]:
    """The leader's fit as a JSON document (the crossover it routes by apart)."""
    return {
        "fitted_at": online.fitted_at,
        "samples": len(online.samples),
        "shared": online.shared,
        "fits": [asdict(f) for f in online.fits],
        "drift": list(online.drift),
        "peers": online.peers,
        "accept_length": online.accept_length,
        "left_out": online.left_out,
        "beside": online.beside,
        "live_bands": [
            None if b is None else [list(band) for band in b] for b in online.live_bands
        ],
    }


def take(online: Online, adopted: float | None, document: dict[str, Any] | None) -> None:
    """In another worker: route by what the board holds (``adopted``: ``on_board``), and
    show the fit of ``document`` (None: the one shown stands). A document that does not
    read raises ValueError, KeyError or TypeError, after the board's crossover is taken
    (bands that are only in it: none, the profile's) and before anything of it is."""
    online.adopted = None if adopted == IN_THE_FIT else adopted
    if document is None:
        return
    live = _live_bands(document.get("live_bands", ())) if adopted == IN_THE_FIT else None
    fits = tuple(_live_fit(f) for f in document["fits"])
    drift = tuple(bool(d) for d in document["drift"])
    if len(drift) != len(fits):
        raise ValueError(f"{len(fits)} fits with {len(drift)} drift flags")
    fitted_at, samples = document["fitted_at"], int(document["samples"])
    given = document.get("accept_length")
    accept = None if given is None else float(given)
    left_out, beside = int(document.get("left_out", 0)), int(document.get("beside", 0))
    online.fits, online.drift, online.fitted_at = fits, drift, fitted_at
    online.counted, online.shared = samples, bool(document["shared"])
    online.peers = [dict(p) for p in document.get("peers", [])]
    online.accept_length, online.left_out, online.beside = accept, left_out, beside
    if live is not None:
        online.live_bands = live


def _live_bands(raw: Any) -> LiveBands:
    """The live bands of a published fit: per fit, None or a list of [from, to]."""
    return tuple(
        None if bands is None else tuple((_end(a), _end(b)) for a, b in bands) for bands in raw
    )


def _end(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"a band's end is a number or null, not {value!r}")
    return float(value)


def _live_fit(raw: dict[str, Any]) -> LiveFit:
    crossing = raw["crossing"]
    return LiveFit(
        raw["context"],
        {
            pool: tuple(Level(**level) for level in raw["curves"][pool])
            for pool in POOLS
            if pool in raw["curves"]
        },
        None
        if crossing is None
        else LiveCrossing(
            **(
                crossing
                | {
                    "levels": tuple(crossing["levels"]),
                    "edges": tuple(LiveEdge(**e) for e in crossing.get("edges", ())),
                }
            )
        ),
        raw["samples"],
        raw["min_samples"],
        tuple((POOLS[POOLS.index(pool)], float(level)) for pool, level in raw.get("live", ())),
        float(raw.get("prefill_slope", 0.0)),
    )
