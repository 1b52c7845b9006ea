"""A profile written as SGLang 0.5.23's adaptive schedule (``--speculative-adaptive-config``):
the speculative server itself drafts to the calibrated depth at the batch sizes where the
profile says speculation pays, and not at all elsewhere.

SGLang chooses a depth per decode batch, not per request: a batch of N requests runs as the
next captured CUDA-graph batch size at or above N, and takes the schedule's slot at or below
that size (``emulator.adaptive``). So each slot here starts at a captured size, and a batch
drafts as the size its graph runs at: where a band's edge falls between two captured sizes
(above 8 they are 2, 4, 8 and then 16 apart), the batches between the edge and the next
captured size take that size's side of the edge. A band's edge is a load, the requests the
speculative server runs; the schedule reads it as a batch size, the same count while the
server decodes. What the schedule cannot hold: a profile's context axis (SGLang's slots know
batch sizes only; the top-level crossover is written), and routing itself: one server with
this schedule still batches every request together, at whatever depth its batch size says.

vLLM takes the same kind of schedule (``num_speculative_tokens_per_batch_size`` in its
``--speculative-config``): inclusive ranges of batch sizes from 1, each with its number of
speculative tokens, the last carried on past its end. It looks a batch's size up as it is,
with no padding to a captured size, so its ranges follow the bands' edges exactly.
"""

from __future__ import annotations

import json
import math
from typing import Any

from specroute.crossing import Band
from specroute.emulator.adaptive import slots, spec_graph_batch_sizes
from specroute.policies.profile import Profile, ProfileError

_NEVER = (
    "speculation paid at no load the profile measured: serve without speculation (a "
    "schedule of depth 0 throughout pays for the draft at every step and drafts nothing; "
    "SGLang starts an adaptive server only at a depth its schedule offers)"
)


def settings_of(profile: Profile) -> tuple[int | None, int | None]:
    """The speculative server's depth and largest CUDA-graph batch, as calibration read
    them from it (None where the profile does not say)."""
    servers = profile.raw.get("servers")
    spec = servers.get("spec") if isinstance(servers, dict) else None
    if not isinstance(spec, dict):
        return None, None
    steps, graphs = spec.get("speculative_num_steps"), spec.get("cuda_graph_max_bs")
    return (
        steps if isinstance(steps, int) else None,
        graphs if isinstance(graphs, int) else None,
    )


def resolved(
    profile: Profile, steps: int | None = None, graph_max_bs: int | None = None
) -> tuple[int, int]:
    """The depth and the largest captured batch a schedule is written for: those given, else
    the profile's; a ``ProfileError`` where neither says."""
    steps = depth_of(profile, steps)
    graph_max_bs = graph_max_bs if graph_max_bs is not None else settings_of(profile)[1]
    if graph_max_bs is None or graph_max_bs < 1:
        raise ProfileError(
            "the profile does not say the speculative server's cuda_graph_max_bs: give it"
        )
    return steps, graph_max_bs


def depth_of(profile: Profile, steps: int | None = None) -> int:
    """The depth where speculation pays: the one given, else the profile's; a
    ``ProfileError`` where neither says."""
    steps = steps if steps is not None else settings_of(profile)[0]
    if steps is None or steps < 1:
        raise ProfileError(
            "the profile does not say the speculative server's speculative_num_steps: give "
            "the depth it was calibrated at"
        )
    return steps


def adaptive_schedule(
    profile: Profile, steps: int | None = None, graph_max_bs: int | None = None
) -> dict[str, Any]:
    """The schedule: depth ``steps`` (else the profile's) in slots whose batches speculation
    pays at, 0 in the others; ``graph_max_bs``: the server's largest captured batch (else
    the profile's)."""
    steps, graph_max_bs = resolved(profile, steps, graph_max_bs)
    bands = profile.crossover.bands
    schedule: dict[str, Any] = {}
    last: bool | None = None
    for size in _sizes(bands, graph_max_bs):
        pays = _inside(size, bands)
        if pays != last:
            schedule[str(size)] = {"candidate_steps": [steps if pays else 0]}
            last = pays
    slots(schedule)  # as SGLang would read it
    if not any(entry["candidate_steps"] == [steps] for entry in schedule.values()):
        raise ProfileError(_NEVER)
    return schedule


def vllm_schedule(profile: Profile, steps: int) -> list[list[int]]:
    """The schedule as vLLM's ``num_speculative_tokens_per_batch_size``: ``[start, end,
    tokens]`` ranges of batch sizes from 1, ``steps`` where speculation pays and 0 elsewhere,
    up to past the last edge (the last range's count goes on above it)."""
    bands = profile.crossover.bands
    edges = [e for band in bands for e in band if e is not None and math.isfinite(e)]
    top = max([1, *(math.floor(e) + 1 for e in edges)])
    ranges: list[list[int]] = []
    for size in range(1, top + 1):
        tokens = steps if _inside(size, bands) else 0
        if ranges and ranges[-1][2] == tokens:
            ranges[-1][1] = size
        else:
            ranges.append([size, size, tokens])
    if not any(tokens for _, _, tokens in ranges):
        raise ProfileError(_NEVER)
    return ranges


def started_with(path: str, steps: int) -> str:
    """How to start SGLang's speculative server with the schedule at ``path``: it refuses
    a ``--speculative-num-steps`` that is not one of the schedule's depths."""
    return (
        f"start the speculative server with --speculative-adaptive "
        f"--speculative-adaptive-config {path} --speculative-num-steps {steps}"
    )


def vllm_started_with(schedule: list[list[int]], steps: int) -> str:
    """How to start vLLM's speculative server with ``schedule``: in its speculative config,
    beside the method and draft it already has."""
    config = {"num_speculative_tokens": steps, "num_speculative_tokens_per_batch_size": schedule}
    said = json.dumps(config)[1:-1]
    return f'start vLLM with --speculative-config \'{{"method": ..., "model": ..., {said}}}\''


def describe(schedule: dict[str, Any], graph_max_bs: int) -> str:
    """The slots in words: the batches each drafts, padding counted, and to which depth."""
    captured = spec_graph_batch_sizes(graph_max_bs)
    sizes = sorted(int(k) for k in schedule if k.isdigit())
    firsts = [_first_batch(size, captured) for size in sizes]
    depths = [schedule[str(size)]["candidate_steps"][0] for size in sizes]
    parts = []
    for first, after, depth in zip(firsts, [*firsts[1:], None], depths, strict=True):
        span = f"batches {first} and up" if after is None else f"batches {first}-{after - 1}"
        parts.append(f"{span}: depth {depth}")
    return "; ".join(parts)


def _first_batch(size: int, captured: list[int]) -> int:
    """The smallest batch that runs as ``size``: one past the captured size below it."""
    below = [c for c in captured if c < size]
    return below[-1] + 1 if below and size in captured else size


def _sizes(bands: tuple[Band, ...], graph_max_bs: int) -> list[int]:
    """The batch sizes a slot can start at: the captured ones, and every size past the
    largest (a batch too large for a graph runs as itself), up to past the last edge."""
    edges = [e for band in bands for e in band if e is not None and math.isfinite(e)]
    top = max([graph_max_bs, *(math.floor(e) + 1 for e in edges)])
    captured = spec_graph_batch_sizes(graph_max_bs)
    return [*captured, *range(graph_max_bs + 1, top + 1)]


def _inside(size: int, bands: tuple[Band, ...]) -> bool:
    return any((lo is None or size >= lo) and (hi is None or size < hi) for lo, hi in bands)
