"""``GET /v1/loads`` (and SMG's name for it, ``/get_loads``): the router's load in the
shape SGLang gives its own, so that what balances over SGLang servers balances over
specroute replicas too. SMG's load monitor polls ``/v1/loads`` on each of its workers (for
``power_of_two``, its data-parallel cache and its overload protection); a specroute in
front of specroute replicas reads it as a server's, knows a replica by ``version``, and
checks it at ``/ready``.

One entry a backend, in the place of SGLang's data-parallel ranks, each with the load the
router routes by (``--concurrency-source``): running plus waiting is that load, the waiting
being what the backend last reported queued (none when its report is stale or the router
counts alone). ``num_used_tokens`` is the KV cache's tokens in use that the backend last
reported (SGLang's, from its ``/v1/loads`` or ``/metrics``), else the router's estimate of
the context its own requests hold there; ``max_total_num_tokens`` and ``token_usage`` come
with a report of the cache's size, so that a gateway's KV overload protection sees the
servers' caches fill. The requests waiting in the router's own queue belong to no backend:
they are in ``aggregate``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from datetime import UTC, datetime

from aiohttp import web

from specroute.policies.view import BackendView, ConcurrencySource
from specroute.release import release
from specroute.router.admission.auth import without_credentials
from specroute.router.backends.backend import SPECROUTE_VERSION
from specroute.router.operator.answers import LoadEntry, LoadsAggregate, LoadsAnswer, Speculative
from specroute.router.operator.watching import Watching
from specroute.router.protocol.errors import error_response
from specroute.router.workers.board import Reading

SECTIONS = ("core", "memory", "spec", "lora", "disagg", "queues", "all")  # SGLang's
FORMATS = ("json", "prometheus")


async def loads(request: web.Request, watching: Watching) -> web.Response:
    """Every backend's load, or one's (``dp_rank``), as JSON or Prometheus text."""
    asked = _asked(request.query)
    if isinstance(asked, web.Response):
        return asked
    form, sections, rank = asked
    view, now = watching.view(), time.monotonic()
    backends, stale_after = watching.backends, watching.stale_after
    entries = [
        _entry(i, backends[i].url, b, backends[i].reading(stale_after, now), view.source, sections)
        for i, b in enumerate(view.backends)
    ]
    if rank is not None:
        if not 0 <= rank < len(entries):
            return error_response(
                400,
                f"dp_rank {rank} is not one of the router's backends (0 to {len(entries) - 1}).",
                param="dp_rank",
            )
        entries = [entries[rank]]
    if form == "prometheus":
        return web.Response(text=_text(entries), content_type="text/plain", charset="utf-8")
    queued = watching.quota.queued()
    running = sum(e.num_running_reqs for e in entries)
    waiting = sum(e.num_waiting_reqs for e in entries) + queued
    answer = LoadsAnswer(
        timestamp=datetime.now(UTC).isoformat(),
        version=f"{SPECROUTE_VERSION}{release()}",
        dp_rank_count=len(entries),
        loads=entries,
        aggregate=LoadsAggregate(
            total_running_reqs=running,
            total_waiting_reqs=waiting,
            total_reqs=running + waiting,
            router_waiting_reqs=queued,
        ),
    )
    return web.json_response(answer.model_dump(mode="json", exclude_none=True))


def _asked(query: Mapping[str, str]) -> tuple[str, frozenset[str], int | None] | web.Response:
    """The format, the sections (SGLang's names; all by default) and the rank asked for,
    or the 400 that says which is wrong."""
    form = query.get("format", "json")
    if form not in FORMATS:
        return error_response(400, f"format must be one of {', '.join(FORMATS)}.", param="format")
    sections = frozenset(SECTIONS)
    if (include := query.get("include")) is not None:
        asked = {s.strip() for s in include.split(",") if s.strip()}
        if unknown := asked - sections:
            return error_response(
                400,
                f"include: unknown sections {', '.join(sorted(unknown))}; "
                f"valid: {', '.join(SECTIONS)}.",
                param="include",
            )
        sections = sections if "all" in asked else frozenset(asked)
    raw = query.get("dp_rank")
    try:
        rank = None if raw is None else int(raw)
    except ValueError:
        return error_response(400, "dp_rank must be an integer.", param="dp_rank")
    return form, sections, rank


def _entry(
    rank: int,
    url: str,
    b: BackendView,
    reading: Reading | None,
    source: ConcurrencySource,
    sections: frozenset[str],
) -> LoadEntry:
    load = b.load(source)
    waiting = 0 if b.running is None else min(b.queued or 0, load)
    used = b.kv_tokens if reading is None or reading.used_tokens is None else reading.used_tokens
    size = None if reading is None or not reading.max_tokens else reading.max_tokens
    accept = b.accept_length if "spec" in sections else None
    return LoadEntry(
        dp_rank=rank,
        worker=without_credentials(url),
        pool=b.pool,
        healthy=b.healthy,
        timestamp=time.time(),
        num_running_reqs=load - waiting,
        num_waiting_reqs=waiting,
        num_used_tokens=used,
        max_running_requests=b.max_running_requests,
        max_total_num_tokens=size,
        token_usage=None if size is None else used / size,  # the KV cache's size, and its use
        speculative=None if accept is None else Speculative(accept_length=accept),
    )


def _text(loads: list[LoadEntry]) -> str:
    """SGLang's Prometheus form: a gauge a number, one sample a rank, a section's fields
    named after it (``speculative`` as ``spec``)."""
    samples: dict[str, list[str]] = {}
    for entry in (load.model_dump(exclude_none=True) for load in loads):
        rank = entry["dp_rank"]
        fields = [(f"sglang_{k}", v) for k, v in entry.items() if k not in ("dp_rank", "timestamp")]
        fields += [(f"sglang_spec_{k}", v) for k, v in entry.get("speculative", {}).items()]
        for name, value in fields:
            if isinstance(value, int | float) and not isinstance(value, bool):
                samples.setdefault(name, []).append(f'{name}{{dp_rank="{rank}"}} {value}')
    lines = [line for name, kept in samples.items() for line in [f"# TYPE {name} gauge", *kept]]
    return "\n".join(lines) + "\n"
