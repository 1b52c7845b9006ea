"""What a policy sees: a snapshot of the backends that the router fills in.

Policies never touch the network; the router hands them this frozen picture, stamped
with the time each backend's numbers were read so a policy can tell stale data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal, NamedTuple

from specroute.crossing import Band, first_top

Pool = Literal["spec", "base"]
LiveBands = tuple[tuple[Band, ...] | None, ...]  # per context bucket: None, the profile's
POOLS: tuple[Pool, ...] = ("spec", "base")


class ConcurrencySource(StrEnum):
    """Where live concurrency comes from: the router's own count of in-flight requests;
    the backends' reported running + queued; the larger of the two; or, for several router
    replicas sharing the backends (each sees only its own share of the traffic), the
    backends' report brought up to date with this router's own changes since: the requests
    it sent there since, less those of its own that have ended."""

    ROUTER = "router"
    BACKEND = "backend"
    MAX = "max"
    REPLICAS = "replicas"


class BackendView(NamedTuple):  # built for every backend at every request: a tuple is cheapest
    name: str
    pool: Pool
    healthy: bool
    inflight: int  # the router's own count
    running: int | None = None  # the backend's report, None when stale or missing
    queued: int | None = None
    accept_length: float | None = None  # over the last window with verify steps (counters)
    accept_length_age: float | None = None  # seconds since that window: no traffic, no news
    max_running_requests: int | None = None
    inflight_then: int = 0  # the router's own requests in flight here at the report
    group: str = ""  # the GPUs it runs on, shared with the other pool's server of the group
    kv_tokens: int = 0  # the estimated context (KV tokens) of the router's requests in flight

    def load(self, source: ConcurrencySource) -> int:
        if source is ConcurrencySource.ROUTER or self.running is None:  # at every request
            return self.inflight
        reported = self.running + (self.queued or 0)
        if source is ConcurrencySource.BACKEND:
            return reported
        if source is ConcurrencySource.REPLICAS:
            return max(0, reported - self.inflight_then + self.inflight)
        return max(self.inflight, reported)


class Seat(NamedTuple):
    """Where a new request would run, and the load it would join there: in the partitioned
    topology the least-loaded speculative server and its own load (each server's GPUs are
    its own); in the shared topology the least-loaded GPU group, its servers of each pool
    and the load of the whole group."""

    load: int
    key: str  # the server or group, for a policy's memory of it
    spec: BackendView | None
    base: BackendView | None


@dataclass(frozen=True)
class View:
    backends: tuple[BackendView, ...]
    source: ConcurrencySource = ConcurrencySource.ROUTER
    now: float = 0.0
    # the bands learned from live traffic per context bucket of the profile (one without
    # a context axis), when the router routes by them (``--online adopt``, sure enough);
    # None where the profile's stand, () when none is
    live_bands: LiveBands = ()

    @property
    def live_crossover(self) -> float | None:
        """The live crossover routed by (the first band's top) for one context, if any."""
        if len(self.live_bands) != 1 or (only := self.live_bands[0]) is None:
            return None
        return first_top(only)

    def healthy(self, pool: Pool) -> tuple[BackendView, ...]:
        return tuple([b for b in self.backends if b.pool == pool and b.healthy])

    def accept_length(self, max_age: float = math.inf) -> float | None:
        """The speculative pool's live accept length: the mean of its healthy servers'
        readings from windows no older than ``max_age`` seconds (None: none). One rule for
        the policy that scales by it, the online fit and the live profile, so that each
        reads the same number."""
        live = [
            b.accept_length
            for b in self.healthy("spec")
            if b.accept_length is not None and (b.accept_length_age or 0.0) <= max_age
        ]
        return sum(live) / len(live) if live else None

    def load(self, pool: Pool | None = None) -> int:
        """Live concurrency of one pool, or of the whole deployment."""
        source = self.source
        return sum([b.load(source) for b in self.backends if pool is None or b.pool == pool])

    def least_loaded(self, pool: Pool, group: str | None = None) -> BackendView | None:
        candidates = self.healthy(pool)
        if group is not None:
            candidates = tuple([b for b in candidates if b.group == group])
        if len(candidates) < 2:
            return candidates[0] if candidates else None
        return min(candidates, key=lambda b: (b.load(self.source), b.inflight, b.name))

    def group_load(self, group: str, pool: Pool | None = None) -> int:
        """Live concurrency on one GPU group: both pools' servers there (or ``pool``'s),
        healthy or not (an ejected server's requests still run on those GPUs)."""
        source = self.source
        return sum(
            [
                b.load(source)
                for b in self.backends
                if b.group == group and (pool is None or b.pool == pool)
            ]
        )

    def group_context(self, group: str) -> tuple[int, int]:
        """The router's estimated KV tokens in flight on one GPU group, and its requests
        there: both pools' servers, as ``group_load`` counts them."""
        members = [b for b in self.backends if b.group == group]
        return sum([b.kv_tokens for b in members]), sum([b.inflight for b in members])

    def seat(self, topology: str) -> Seat:
        if topology == "partitioned":
            spec = self.least_loaded("spec")
            load = 0 if spec is None else spec.load(self.source)
            return Seat(load, "" if spec is None else spec.name, spec, self.least_loaded("base"))
        groups = {b.group for b in self.backends if b.healthy}
        if len(groups) < 2:  # one group, the common case: every healthy backend is in it
            group = next(iter(groups), "")
            load = self.group_load(group)
            return Seat(load, group, self.least_loaded("spec"), self.least_loaded("base"))
        loads = {g: self.group_load(g) for g in groups}
        group = min(loads, key=lambda g: (loads[g], g))
        load = loads[group]
        return Seat(load, group, self.least_loaded("spec", group), self.least_loaded("base", group))


def joined_context(there: tuple[int, int], own: int) -> float:
    """The context mix a request would join: the KV tokens in flight where it would run and
    its own, over those requests and it (``there`` is their KV tokens and their number)."""
    kv_tokens, requests = there
    return (kv_tokens + own) / (requests + 1)


TOKENS_PER_BYTE = 0.25  # of prompt text, when no profile measured it: English under BPE
UNSAID_MAX_TOKENS = 256  # a request that sets no limit: a typical answer, not the engine's cap
# no model holds more; a client's max_tokens may be any integer, and the sums of estimates
# live in 64-bit slots of the workers' shared board
MAX_CONTEXT = 1 << 31


class Tokens(NamedTuple):
    """A request's tokens, estimated without a tokenizer (``RequestInfo.tokens``)."""

    prompt: int  # its prompt's
    context: int  # its mean KV tokens while it decodes


@dataclass(frozen=True)
class RequestInfo:
    """What a policy may know of a request without reading the network."""

    path: str
    stream: bool = False
    max_tokens: int | None = None
    prompt_bytes: int = 0  # UTF-8 bytes of the prompt's text
    prompt_tokens: int = 0  # prompt given as token ids (completions, /generate)
    prefix: bytes = b""  # the prompt's first bytes, when a placement keys on them

    def context(self, tokens_per_byte: float) -> int:
        """The request's mean KV tokens while it decodes, estimated without a tokenizer: its
        prompt, plus half of its output limit (the KV grows from the prompt to the prompt
        and the whole output, so half is the mean over its decode)."""
        return self.tokens(tokens_per_byte).context

    def tokens(self, tokens_per_byte: float) -> Tokens:
        """Its prompt's tokens (its text's bytes at ``tokens_per_byte``, and its token ids)
        and its context (``context``)."""
        prompt = min(round(self.prompt_bytes * tokens_per_byte) + self.prompt_tokens, MAX_CONTEXT)
        limit = UNSAID_MAX_TOKENS if self.max_tokens is None else max(0, self.max_tokens)
        return Tokens(prompt, min(prompt + limit // 2, MAX_CONTEXT))
