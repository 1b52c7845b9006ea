"""The router's side of a mixed run: its counters, read from ``/metrics``, and the checks
that they agree with the client's ``Tally`` (``agreement``), exact but for the races of the
client's own cancels (``races``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from specroute import prometheus
from specroute.bench.mix import Tally, Verdict


@dataclass(frozen=True)
class RouterCounts:
    requests: dict[str, float]  # specroute_requests_total by status
    served: dict[str, float]  # specroute_requests_total by backend
    decisions: dict[str, float]  # specroute_route_decisions_total by reason
    upstream_errors: dict[str, float]  # by kind
    inflight: float  # every specroute_inflight summed
    router_errors: float
    ejections: float

    @classmethod
    def read(cls, text: str) -> RouterCounts:
        def by(name: str, label: str) -> dict[str, float]:
            found: Counter[str] = Counter()
            for s in prometheus.samples(text, (name,)):
                found[s.labels.get(label, "")] += int(s.value)
            return dict(sorted(found.items()))

        def total(name: str) -> float:
            return sum(s.value for s in prometheus.samples(text, (name,)))

        return cls(
            by("specroute_requests_total", "status"),
            by("specroute_requests_total", "backend"),
            by("specroute_route_decisions_total", "reason"),
            by("specroute_upstream_errors_total", "kind"),
            total("specroute_inflight"),
            total("specroute_router_errors_total"),
            total("specroute_backend_ejections_total"),
        )

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"decisions_total": sum(self.decisions.values())}


async def scrape(session: aiohttp.ClientSession, url: str) -> RouterCounts:
    async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as r:
        return RouterCounts.read(await r.text())


async def settle(session: aiohttp.ClientSession, url: str, seconds: float = 15.0) -> RouterCounts:
    """The router's counts once nothing is in flight (a cancel lands a moment later), or
    after ``seconds`` whatever they are."""
    counts = await scrape(session, url)
    for _ in range(int(seconds / 0.05)):
        if counts.inflight == 0:
            break
        await asyncio.sleep(0.05)
        counts = await scrape(session, url)
    return counts


def races(tally: Tally, counts: RouterCounts) -> dict[str, Any]:
    """Where the router's counts may differ from the client's, and only because a client's
    cancel raced the router: each bounded by the cancels in ``agreement``.

    ``by_status``: router minus client, where they differ; a cancel that reached the router
    after it had relayed the whole answer (or the error event of a broken stream) is counted
    there as such. ``undecided``: cancels that left before the router decided where to send
    them, in none of its counts. ``failed_then_left``: backend failures after the first byte
    on requests the router counted cancelled, the client gone before the error event."""
    labels = set(tally.labels) | set(counts.requests)
    diff = {s: counts.requests.get(s, 0) - tally.labels[s] for s in sorted(labels)}
    e, r = counts.upstream_errors, counts.requests
    before_first_byte = (
        e.get("connect", 0)
        + e.get("unavailable", 0)
        + e.get("midstream", 0)
        + e.get("timeout", 0)
        - r.get("timeout", 0)
        - r.get("broken", 0)
        - r.get("truncated", 0)
    )
    retries = counts.decisions.get("retry", 0)
    return {
        "by_status": {s: d for s, d in diff.items() if d != 0},
        "undecided": tally.count + retries - sum(counts.decisions.values()),
        "failed_then_left": before_first_byte - retries - tally.refused["tried"],
    }


def agreement(tally: Tally, counts: RouterCounts) -> dict[str, str | None]:
    """Each check by name: None when it holds, else what differs. Exact, but for the races
    of a client's cancels (``races``), each of which must be one of the cancels."""
    checks: dict[str, str | None] = {}
    lost = tally.verdicts[Verdict.LOST]
    checks["nothing lost"] = None if lost == 0 else f"{lost} lost: {tally.lost[:3]}"
    garbled = tally.verdicts[Verdict.GARBLED]
    checks["no garbled streams"] = None if garbled == 0 else f"{garbled} compressed streams"
    raced = races(tally, counts)
    diff, undecided = raced["by_status"], raced["undecided"]
    wrong = {s: d for s, d in diff.items() if (d < 0 if s != "cancelled" else d > 0)}
    checks["statuses agree"] = (  # each decided request counted once, as the client saw it
        None
        if not wrong and sum(diff.values()) == -undecided
        else f"router minus client by status: {diff}, {undecided:g} never decided"
    )
    cancels = tally.verdicts[Verdict.CANCELLED]
    retries = counts.decisions.get("retry", 0)
    checks["decisions = requests + retries"] = (
        None
        if 0 <= undecided <= cancels
        else f"{sum(counts.decisions.values()):g} decisions, {tally.count} requests, "
        f"{retries:g} retries"
    )
    left = raced["failed_then_left"]
    checks["retries explained"] = (  # every failure before a first byte retried or refused
        None
        if 0 <= left <= counts.requests.get("cancelled", 0)
        else f"{left:+g} failures before a first byte beyond {retries:g} retries and "
        f"{tally.refused['tried']} refusals"
    )
    checks["in flight ends at 0"] = None if counts.inflight == 0 else f"{counts.inflight:g}"
    checks["no router errors"] = None if counts.router_errors == 0 else f"{counts.router_errors:g}"
    return checks


def describe_races(raced: dict[str, Any]) -> str:
    said = [f"router minus client {raced['by_status']}"] if raced["by_status"] else []
    said += [
        f"{raced[k]:g} {k.replace('_', ' ')}" for k in ("undecided", "failed_then_left") if raced[k]
    ]
    return ", ".join(said) or "none"


def check_lines(checks: Mapping[str, str | None]) -> list[str]:
    """One line a check: ok, or FAIL and what differs."""
    return [
        f"  ok   {name}" if problem is None else f"  FAIL {name}: {problem}"
        for name, problem in checks.items()
    ]
